"""`plan_patch`: what a patching sweep (or search) of any model will do, resolved and checked before torch.

    plan = plan_patch("models/sraven-hyla", grid="slot", layers=[2], n=64, out="results/slots")
    plan = plan_patch("smollm2", task={"seq_len": 128}, grid="heads", layers=[3], n=32)
    plan.inputs, plan.cost          # what is patched and measured (PairInputs, WindowInputs); the work
    result = patch(plan)            # latentcode.intervention.patching.run (torch)

The subject (`latentcode.subject`) says what the model reads, and so what is patched: a run's task draws
counterfactual pairs (donors of another sub-task, a third one as the baseline, the base's own for the
damage; `latentcode.intervention.transfer`); a causal LM reads token windows, each taking the codes of
another (`TokenWindows.donors`: resample ablation, read on the next-token loss). The rest is one plan
for both: the groups (rows, heads, offset bands, partitions, --group, or --search) and their controls,
attribution, the cost against `max_groups`, the output stem; one message for one mistake from Python
and the command line (`errors.about` names the argument). JSON and numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from latentcode.errors import UsageError, about
from latentcode.intervention.patching.site_groups import offset_groups
from latentcode.sources.sites import (
    SiteError,
    layers_and_first_query,
    parse_positions,
    parse_selector,
    resolve_positions,
)
from latentcode.subject import Subject, subject_of
from latentcode.tasks import Task, task_class, task_names
from latentcode.tasks.partitions import grid_size, parse_grid, task_partitions
from latentcode.token_windows import DEFAULT_SEQ_LEN, MAX_TOKENS_PER_PASS, TokenWindows
from latentcode.validation import (
    check_fits_in_memory,
    check_integer,
    check_output_stem,
    check_placement,
    check_split,
    check_variant,
)

MAX_GROUPS = 256
DEFAULT_PAIRS = 256  # base/donor pairs of a run's task
DEFAULT_WINDOWS = 32  # base windows of a causal LM (each with a donor window)
SUFFIXES = (".csv", ".json", ".png")
SEARCH_SUFFIXES = (".csv", ".candidates.csv", ".json", ".png")
DONORS = ("different", "third", "same")  # r', a third sub-task (the baseline), the base's own (damage)
# Tokens a whole sweep of windows may run through the model (window passes x seq_len), refused up front as
# groups beyond --max-groups are: 2^28 tokens are about 7 hours of SmolLM2-135M at 10^4 tokens a second.
MAX_PATCH_TOKENS = 2**28
LOGIT_BYTES_PER_TOKEN = 3 * 4 * 65_536  # logits, their log-softmax and a copy, float32, a vocabulary up to 64k


class _Inputs:
    """What both inputs answer alike unless they say otherwise."""

    def at(self, first_query: int) -> Any:
        return self  # read where the inputs say (a run's pairs: at the prediction), whatever the groups

    def check_budget(self, cost: Mapping[str, int], n: int) -> None:
        pass  # the groups are bounded by --max-groups, the pairs by memory

    def partitions(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """The partitions of the task's positions its grids and the search read (`task_partitions`)."""
        return task_partitions(self.task)

    def measure(self, loaded: Any, n: int, seed: int) -> Any:
        """`n` bases drawn with `seed` for `loaded`, and what is measured on them (`measures`)."""
        from latentcode.intervention.patching import measures

        return getattr(measures, self.measured_by).draw(self, loaded, n, seed)


@dataclass(frozen=True)
class PairInputs(_Inputs):
    """A run's task's counterfactual pairs of `split` (`variant`), measured at prediction `prediction`."""

    task: Task
    split: str
    variant: str
    prediction: int
    grids = ("rows", "heads", "offsets")  # and the task's partitions
    effect = "transfer"  # the per-example effect a control is read on
    unit, measured_by, per_group = "pair", "PairsMeasure", "3 x --n {n} forward passes"

    def cost(self, groups: int, n: int) -> dict[str, int]:
        return {"groups": groups, "examples": len(DONORS) * n * (groups + 2)}

    def selector(self, spec: str) -> Any:
        return parse_selector(spec, self.task)


@dataclass(frozen=True)
class WindowInputs(_Inputs):
    """A causal LM's token windows `task` of `split`, each patched with another window's codes and read on
    the next-token metrics from `first_query` on, in passes of `batch_size` windows."""

    task: TokenWindows
    split: str
    first_query: int = 0
    batch_size: int = 1
    variant = None
    prediction = None
    grids = ("heads", "offsets")  # and the windows' partitions (TokenWindows.position_partitions)
    effect = "change"
    unit, measured_by, per_group = "window", "WindowsMeasure", "--n {n} window forward passes"

    def cost(self, groups: int, n: int) -> dict[str, int]:
        batches = -(-n // self.batch_size)
        return {"groups": groups, "window_passes": n * (groups + 2), "passes": batches * (groups + 2)}

    def selector(self, spec: str) -> Any:
        return parse_selector(spec)

    def at(self, first_query: int) -> WindowInputs:
        """The windows read from `first_query` (the first query the groups change) on."""
        return replace(self, first_query=first_query)

    def check_budget(self, cost: Mapping[str, int], n: int) -> None:
        """Refuse a sweep beyond MAX_PATCH_TOKENS tokens through the model."""
        tokens = cost.get("window_passes", cost.get("examples", 0)) * self.task.seq_len
        if tokens > MAX_PATCH_TOKENS:
            with about("n"):
                raise UsageError(f"n={n} windows x ({cost['groups']} groups + 2) passes x {self.task.seq_len} tokens "
                                 f"is {tokens:,} tokens through the model, beyond the budget of {MAX_PATCH_TOKENS:,} "
                                 "(hours of a CPU); give a smaller --n, fewer --layers or a shorter --task seq_len")


@dataclass(frozen=True)
class PatchPlan:
    """One patching sweep (or search) of `subject`: `n` bases of `inputs` (seed `seed`), patched at the
    groups of `grid` (rows, heads, offsets, or the task's partitions `partition_grid` = (query part,
    key part)), of `groups` (selector specs) or found by `search`, in `layers`; `cost`: groups patched
    and forward passes (an upper bound for a search); `out`: the stem of the outputs (None: nothing is
    written); `device`, `dtype`: where and in what the model runs (None: the CPU, float32)."""

    subject: Subject
    inputs: PairInputs | WindowInputs
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
    split = property(lambda self: self.inputs.split)
    variant = property(lambda self: self.inputs.variant)
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
    `task` may give its window length, {"seq_len": T}). device, dtype: `validation.check_placement`."""
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
    reads = subject.task(task, DEFAULT_SEQ_LEN)  # a run's Task, or a causal LM's TokenWindows
    if isinstance(reads, TokenWindows):
        n = DEFAULT_WINDOWS if n is None else n
        inputs = _window_inputs(subject, reads, split, variant, prediction, per_head, n)
    else:
        n = DEFAULT_PAIRS if n is None else n
        inputs = _pair_inputs(subject, reads, split, variant, n, prediction)
    grid = grid or (None if groups or search else inputs.grids[0])
    layers, query_positions, partition_grid, count, first_query = _groups(
        subject, inputs, grid, groups, layers, queries, key_blocks, sites, per_head, search)
    inputs = inputs.at(first_query)
    if search:
        cost = _search_cost(len(layers), n, confirm_n)
    else:
        if count > max_groups and not groups:
            with about("grid"):
                raise UsageError(f"grid {grid} makes {count} groups, more than --max-groups {max_groups} (each "
                                 f"costs {inputs.per_group.format(n=n)}); give --max-groups {count} to run them all, "
                                 "or fewer layers, parts or blocks")
        cost = inputs.cost(count, n)
    inputs.check_budget(cost, n)
    if out is not None:
        with about("out"):
            out = check_output_stem(out, SEARCH_SUFFIXES if search else SUFFIXES, overwrite)
    return PatchPlan(subject, inputs, n, seed, search, grid, partition_grid, tuple(groups),
                     None if layers is None else tuple(layers),
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


def _pair_inputs(subject: Subject, task: Task, split: str | None, variant: str | None, n: int,
                 prediction: int) -> PairInputs:
    """The run's task (one that draws counterfactual pairs), the split and variant to patch on (defaults:
    the held-out split, the training variant), after checking that `n` pairs fit in memory and that
    `prediction` is one of the task's prediction positions."""
    if not task.provides("counterfactual_pairs"):
        having = [name for name in task_names() if task_class(name).provides("counterfactual_pairs")]
        raise UsageError(f"task {task.name!r} draws no counterfactual pairs (Task.counterfactual_pairs); patch needs "
                         f"them: {' and '.join(having)} have them")
    with about("split"):
        split = check_split(task.analysis.held_out_split if split is None else split, task)
    with about("variant"):
        variant = check_variant(variant or _training_variant(subject.source) or task.variants[0], task)
    # The bases and their three donors are drawn before the first pass ([n, sequence, d_in] each, float32,
    # with int64 indices of several times n while drawing them): what must fit, whatever the groups.
    with about("n"):
        check_fits_in_memory(4 * n * (1 + len(DONORS)) * task.seq_len * (task.d_in or 1) + 32 * n,
                             f"{n} base/donor pairs (sequences of {task.seq_len}, with {len(DONORS)} donors each)")
    if not -task.n_predictions <= prediction < task.n_predictions:
        with about("prediction"):
            raise UsageError(f"prediction {prediction}: the task has {task.n_predictions} prediction positions "
                             f"(0..{task.n_predictions - 1}, or negative from the end)")
    return PairInputs(task, split, variant, prediction)


def _window_inputs(subject: Subject, windows: TokenWindows, split: str | None, variant: str | None,
                   prediction: int, per_head: bool, n: int) -> WindowInputs:
    """The causal LM's windows of `split` (default validation), `n` >= 2 of them (each takes another's
    codes), in passes whose logits fit; what only a task's pairs can give refused in one line."""
    for option, value, default in (("variant", variant, None), ("prediction", prediction, -1),
                                   ("per_head", per_head, False)):
        if value != default:
            with about(option):
                raise UsageError(f"{option} {value!r} needs a run's task; {subject.name} is a pretrained model, "
                                 "patched by resample ablation of its windows (--task seq_len=T)")
    split = windows.check_split(split)
    with about("n"):
        n = check_integer("n", n, minimum=1)
        if n < 2:
            raise UsageError(f"n={n}: resample ablation needs at least 2 windows (each takes the codes of another)")
    batch_size = min(n, max(1, MAX_TOKENS_PER_PASS // windows.seq_len))
    with about("n"):
        check_fits_in_memory(LOGIT_BYTES_PER_TOKEN * batch_size * windows.seq_len,
                             f"passes of {batch_size} windows of {windows.seq_len} tokens (their logits)")
    return WindowInputs(windows, split, 0, batch_size)


def _groups(subject: Subject, inputs: PairInputs | WindowInputs, grid: str | None, groups: list[str],
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
            except ValueError:  # TaskError
                if not isinstance(inputs, WindowInputs):
                    raise
                raise UsageError(f"grid {grid!r}: a pretrained model is patched by (layer, head) (--grid heads), by "
                                 "relative-offset band (--grid offsets) or by its windows' partitions "
                                 f"({', '.join(inputs.partitions())}); rows need a run's task") from None
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
    """The task variant the run was trained on (None: the task's first)."""
    from latentcode.rundir import RunRecord

    return RunRecord.read(source.path).config["train"].get("variant")


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


def _resolvable(inputs: PairInputs | WindowInputs, spec: str, n_layers: int, seq_len: int
                ) -> tuple[tuple[int, ...], int]:
    """The layers a selector names and its first query; one that cannot be read or reaches outside the
    model or the sequence refused."""
    try:
        return layers_and_first_query(inputs.selector(spec), n_layers, seq_len)
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
