"""`plan_patch`: what a patching sweep (or search) of any model will do, resolved and checked before torch.

    plan = plan_patch("models/sraven-hyla", grid="slot", layers=[2], n=64, out="results/slots")
    plan = plan_patch("smollm2", task={"seq_len": 128}, grid="heads", layers=[3], n=32)
    plan.inputs, plan.cost          # what is patched and measured (`latentcode.inputs`); the work
    result = patch(plan)            # latentcode.intervention.patching.run (torch)

The subject (`latentcode.subject`) says what the model reads, and so what is patched: the inputs that
extract and intervene read (`latentcode.inputs`) give the bases and their donors, a run's task its
counterfactual pairs, a causal LM's windows each other's codes (resample ablation). The rest is one plan
for both: the groups (rows, heads, offset bands, partitions, --group, or --search) and their controls,
attribution, the cost against `max_groups`, the output stem; one message for one mistake from Python
and the command line (`errors.about` names the argument). JSON and numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latentcode.errors import UsageError, about
from latentcode.inputs import CorpusWindows, TaskInstances, inputs_of
from latentcode.intervention.patching.site_groups import offset_groups
from latentcode.sources.sites import SiteError, layers_and_first_query, parse_positions, resolve_positions
from latentcode.subject import Subject, subject_of
from latentcode.tasks.partitions import grid_size, parse_grid
from latentcode.token_windows import DEFAULT_SEQ_LEN
from latentcode.validation import check_integer, check_output_stem, check_placement

MAX_GROUPS = 256
SUFFIXES = (".csv", ".json", ".png")
SEARCH_SUFFIXES = (".csv", ".candidates.csv", ".json", ".png")


@dataclass(frozen=True)
class PatchPlan:
    """One patching sweep (or search) of `subject`: `n` bases of `inputs` (seed `seed`) of `split`
    (`variant`; a run's pairs measured at `prediction`; windows read from `first_query` on, in passes of
    `batch_size`), patched at the groups of `grid` (rows, heads, offsets, or the task's partitions
    `partition_grid` = (query part, key part)), of `groups` (selector specs) or found by `search`, in
    `layers`; `cost`: groups patched and forward passes (an upper bound for a search); `out`: the stem
    of the outputs (None: nothing is written); `device`, `dtype`: where and in what the model runs
    (None: the CPU, float32)."""

    subject: Subject
    inputs: TaskInstances | CorpusWindows
    split: str
    variant: str | None
    prediction: int | None
    first_query: int
    batch_size: int
    n: int
    seed: int
    search: bool
    grid: str | None
    partition_grid: tuple[str, str] | None
    groups: tuple[str, ...]
    layers: tuple[int, ...] | None
    query_positions: tuple[int, ...] | None
    key_blocks: int
    sites: str
    per_head: bool
    confirm_n: int
    tolerance: float
    attribution: bool
    cost: Mapping[str, int]
    out: Path | None = None
    overwrite: bool = False
    device: str | None = None
    dtype: str | None = None

    @property
    def suffixes(self) -> tuple[str, ...]:
        """The files written at `out`: table(s), summary and map."""
        return SEARCH_SUFFIXES if self.search else SUFFIXES

    # what a caller reads of the subject and the inputs, as one plan's fields
    source = property(lambda self: self.subject.source)
    task = property(lambda self: self.inputs.task)
    n_layers = property(lambda self: self.subject.n_layers)
    n_heads = property(lambda self: self.subject.n_heads)


def plan_patch(
    run: Any,
    *,
    search: bool = False,
    grid: str | None = None,
    groups: Sequence[str] | None = None,
    per_head: bool = False,
    layers: str | Sequence[int] | None = None,
    queries: str = "*",
    key_blocks: int = 1,
    sites: str = "*:*:*",
    n: int | None = None,
    confirm_n: int = 512,
    tolerance: float = 1.0,
    max_groups: int = MAX_GROUPS,
    split: str | None = None,
    variant: str | None = None,
    prediction: int = -1,
    seed: int = 0,
    attribution: bool = False,
    out: str | Path | None = None,
    overwrite: bool = False,
    task: Mapping | None = None,
    device: str | None = None,
    dtype: str | None = None,
) -> PatchPlan:
    """The plan of `patch` with these arguments (see there), or the first mistake in them. `run`: a run
    directory (its task draws the pairs) or a causal LM ("smollm2", a Hugging Face directory, a .gguf:
    `task` may give its window length, {"seq_len": T}); `n` None: 256 pairs, or 32 windows. device,
    dtype: `validation.check_placement`."""
    with about("run_or_model"):
        subject = _subject_of(run)
    device, dtype = check_placement(device, dtype)
    groups = list(groups or [])
    if sum(bool(choice) for choice in (grid, groups, search)) > 1:
        raise UsageError("give one of --search, --grid or --group")
    if search and attribution:
        raise UsageError("--attribution goes with --grid or --group; --search ranks its candidates by attribution "
                         "itself (the estimates are in <out>.candidates.csv)")
    with about("seed"):
        seed = check_integer("seed", seed, minimum=0)
    if task is not None and not subject.reads_text:
        with about("task"):
            raise UsageError(f"task {task!r}: a run's task is its own (config.json); task goes with a pretrained "
                             "model (its window length, e.g. seq_len=128)")
    inputs = inputs_of(subject.task(task, DEFAULT_SEQ_LEN))  # a run's task's pairs, or a causal LM's windows
    n = inputs.default_n if n is None else n
    split, variant, prediction, batch_size = inputs.check_patch(
        split, variant or _training_variant(subject.source), prediction, per_head, n)
    grid = grid or (None if groups or search else inputs.grids[0])
    layers, query_positions, partition_grid, count, first_query = _groups(
        subject, inputs, grid, groups, layers, queries, key_blocks, sites, per_head, search)
    if search:
        cost = _search_cost(len(layers), n, confirm_n)
    else:
        if count > max_groups and not groups:
            with about("grid"):
                raise UsageError(f"grid {grid} makes {count} groups, more than --max-groups {max_groups} (each "
                                 f"costs {inputs.per_group.format(n=n)}); give --max-groups {count} to run them all, "
                                 "or fewer layers, parts or blocks")
        cost = inputs.patch_cost(count, n, batch_size)
    inputs.check_budget(cost, n)
    if out is not None:
        with about("out"):
            out = check_output_stem(out, SEARCH_SUFFIXES if search else SUFFIXES, overwrite)
    return PatchPlan(subject, inputs, split, variant, prediction, first_query, batch_size, n, seed, search, grid,
                     partition_grid, tuple(groups), None if layers is None else tuple(layers),
                     None if query_positions is None else tuple(query_positions), key_blocks, sites, per_head,
                     confirm_n, tolerance, attribution, cost, out, overwrite, device, dtype)


def _subject_of(run: Any) -> Subject:
    """The subject of a finished run directory (its task draws the pairs) or of a causal LM (resample
    ablation of its windows); a model directory without its run, or anything else, refused in one line."""
    from latentcode.rundir import RunDirectoryError

    try:
        subject = subject_of(run)
    except RunDirectoryError:
        subject = None
    if subject is None or not (subject.reads_text or subject.source.task_config):
        raise UsageError(f"{run} is not a finished run directory (config.json and model/model.safetensors); "
                         "patch reads the task of the run to draw its pairs")
    return subject


def _groups(subject: Subject, inputs: TaskInstances | CorpusWindows, grid: str | None, groups: list[str],
            layers: Any, queries: str, key_blocks: int, sites: str, per_head: bool, search: bool
            ) -> tuple[list[int] | None, list[int] | None, tuple[str, str] | None, int, int]:
    """The checked groups: (layers, query positions of the rows grid, partition grid, number of groups,
    first query any group changes)."""
    n_layers, n_heads, seq_len = subject.n_layers, subject.n_heads, inputs.task.seq_len
    partition_grid = None
    if grid is not None and grid not in inputs.grids:
        with about("grid"):
            try:
                partition_grid = tuple(parse_grid(grid, inputs.partitions()))
            except ValueError as error:  # TaskError
                raise inputs.unknown_grid(grid, error) from None
    if groups:
        with about("groups"):
            first_query = min(_resolvable(inputs, spec, n_layers, seq_len)[1] for spec in groups)
        return None, None, None, len(groups), first_query
    with about("layers"):
        layers = _layers(layers, n_layers)
    if grid == "offsets" and sites != "*:*:*":
        with about("sites"):
            raise UsageError(f"sites {sites!r}: the offsets grid makes its own pairs (each band of every query); "
                             "leave --sites out")
    if grid in ("heads", "offsets"):
        with about("sites"):
            site_layers, first_query = _resolvable(inputs, sites, n_layers, seq_len)
            layers = sorted(set(layers) & set(site_layers))
            if not layers:
                raise UsageError(f"sites {sites!r} name none of the layers swept; give sites such as *:*:* (every "
                                 "pair of each layer) or LAYER:*:* with --layers LAYER")
        return layers, None, None, len(layers) * (n_heads if grid == "heads" else offset_groups(seq_len)), first_query
    if grid == "rows":
        with about("queries"):
            query_positions = _queries(queries, seq_len)
        if key_blocks > seq_len:
            with about("key_blocks"):
                raise UsageError(f"the sequence has {seq_len} keys, so at most {seq_len} key blocks; got {key_blocks}")
        return layers, query_positions, None, len(layers) * len(query_positions) * key_blocks, min(query_positions)
    if search:
        return layers, None, None, 0, 0
    count = grid_size(inputs.partitions(), *partition_grid, len(layers), n_heads if per_head else None)
    return layers, None, partition_grid, count, 0


def _training_variant(source: Any) -> str | None:
    """The task variant the run was trained on (None: the task's first, or no run: a causal LM)."""
    from latentcode.rundir import RunRecord

    return RunRecord.read(source.path).config["train"].get("variant") if source.task_config else None


def _layers(layers: str | Sequence[int] | None, n_layers: int) -> list[int]:
    """Layer indices (a list, or text such as 0,2), each in 0..n_layers - 1 or negative from the end."""
    if layers is None:
        return list(range(n_layers))
    if isinstance(layers, str):
        try:
            chosen = [int(part) for part in layers.split(",") if part.strip()]
        except ValueError:
            raise UsageError(f"layers expects layer indices such as 0,2; got {layers!r}") from None
    else:
        chosen = list(layers)
    bad = [layer for layer in chosen if not -n_layers <= layer < n_layers]
    if not chosen or bad:
        raise UsageError(f"layers {layers!r}: the model has {n_layers} layers (0..{n_layers - 1}); got {bad or 'none'}")
    return [layer % n_layers for layer in chosen]


def _queries(queries: str, seq_len: int) -> list[int]:
    """The query positions of the rows grid: *, an integer, START..STOP or A|B|C."""
    try:
        parsed = parse_positions(queries)
        return list(resolve_positions((parsed,), seq_len) if isinstance(parsed, int) else parsed.resolve(seq_len))
    except SiteError as error:
        raise UsageError(f"queries {queries!r}: {error}") from None
    except ValueError:
        raise UsageError(f"queries expects *, an integer, START..STOP or A|B|C; got {queries!r}") from None


def _resolvable(inputs: TaskInstances | CorpusWindows, spec: str, n_layers: int, seq_len: int
                ) -> tuple[tuple[int, ...], int]:
    """The layers a selector names and its first query; one that cannot be read or reaches outside the
    model or the sequence refused."""
    try:
        return layers_and_first_query(inputs.parse(spec), n_layers, seq_len)
    except ValueError as error:  # SiteError
        raise UsageError(f"{error}") from None


def _search_cost(n_layers: int, n_selection: int, n_confirmation: int, per_step: int = 8, max_rounds: int = 6
                 ) -> dict[str, int]:
    """An upper bound of `site_search`'s work with its defaults: groups patched exactly (the layers, then
    `per_step` per step), confirmed (the route) and example forward passes (2 donors x selection pairs per
    group, 3 x confirmation pairs for each of the 3 confirmed groups, attribution about 6 x selection pairs)."""
    selected = n_layers + per_step * (1 + max_rounds)
    confirmed = 3
    return {"groups": selected + confirmed,
            "examples": 2 * n_selection * selected + 3 * n_confirmation * confirmed + 6 * n_selection}
