"""`plan_patch`: what a patching sweep of a run will do, resolved and checked before torch.

    plan = plan_patch("models/sraven-hyla", grid="slot", layers=[2], n=64, out="results/slots")
    plan.task, plan.split, plan.variant, plan.cost       # the pairs, and groups x forward passes
    result = patch(plan)                                 # latentcode.intervention.patching.run (torch)

The command line's check (`latentcode patch`) builds this plan and its run hands it to `patch`,
which builds the same plan when called from Python: one message for one mistake (`errors.about`
names the argument; the command line shows its flag). Checked here: the run (`rundir.locate_model`),
its model config, the task and whether it draws counterfactual pairs, the split, the variant, the
memory of the pairs, the prediction position, the groups (a grid of the task's partitions, rows,
heads, or groups given as selectors), their number against `max_groups` and the cost, and the
output stem. JSON and numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from latentcode.errors import UsageError, about
from latentcode.intervention.patching.language_plan import LanguagePatchPlan, plan_language_patch
from latentcode.rundir import ModelSource, locate_model
from latentcode.sources.sites import SiteError, parse_positions, parse_selector, resolve_positions
from latentcode.subject import checked_model_config
from latentcode.tasks import Task, get_task, task_class, task_names
from latentcode.tasks.partitions import grid_size, parse_grid, task_partitions
from latentcode.validation import (
    check_fits_in_memory,
    check_output_stem,
    check_placement,
    check_split,
    check_variant,
)

GRIDS = ("rows", "heads")
MAX_GROUPS = 256
DEFAULT_PAIRS = 256  # base/donor pairs of a run's task
DEFAULT_WINDOWS = 32  # base windows of a pretrained model (each with a donor window)
SUFFIXES = (".csv", ".json", ".png")
SEARCH_SUFFIXES = (".csv", ".candidates.csv", ".json", ".png")
DONORS = ("different", "third", "same")  # r', a third sub-task (the baseline), the base's own (damage)


@dataclass(frozen=True)
class PatchPlan:
    """One patching sweep (or search) of the run at `source`: `n` counterfactual pairs of `task`'s
    `split` (`variant`), measured at prediction `prediction`, patched at the groups of `grid`
    (rows, heads, or the task's partitions `partition_grid` = (query part, key part)), of `groups`
    (selector specs) or found by `search`; `cost`: groups patched and example forward passes
    (an upper bound for a search); `out`: the stem of the outputs (None: nothing is written)."""

    source: ModelSource
    task: Task
    split: str
    variant: str
    n: int
    seed: int
    prediction: int
    n_layers: int
    n_heads: int
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
    device: str | None = None  # where and in what the run's model is patched (None: the CPU, float32)
    dtype: str | None = None

    @property
    def suffixes(self) -> tuple[str, ...]:
        """The files written at `out`: table(s), summary and map."""
        return SEARCH_SUFFIXES if self.search else SUFFIXES


def _checked_task(source: ModelSource, split: str | None, variant: str | None, n: int, prediction: int):
    """The run's task (one that draws counterfactual pairs), the split and variant to patch on (defaults:
    the held-out split, the training variant), after checking that `n` pairs fit in memory and that
    `prediction` is one of the task's prediction positions."""
    task = get_task(**source.task_config)
    if not task.provides("counterfactual_pairs"):
        having = [name for name in task_names() if task_class(name).provides("counterfactual_pairs")]
        raise UsageError(f"task {task.name!r} draws no counterfactual pairs (Task.counterfactual_pairs); patch needs "
                         f"them: {' and '.join(having)} have them")
    with about("split"):
        split = check_split(task.analysis.held_out_split if split is None else split, task)
    with about("variant"):
        variant = check_variant(variant or _training_variant(source) or task.variants[0], task)
    # The bases and their three donors are drawn before the first pass ([n, sequence, d_in] each, float32,
    # with int64 indices of several times n while drawing them): what must fit, whatever the groups.
    with about("n"):
        check_fits_in_memory(4 * n * (1 + len(DONORS)) * task.seq_len * (task.d_in or 1) + 32 * n,
                             f"{n} base/donor pairs (sequences of {task.seq_len}, with {len(DONORS)} donors each)")
    if not -task.n_predictions <= prediction < task.n_predictions:
        with about("prediction"):
            raise UsageError(f"prediction {prediction}: the task has {task.n_predictions} prediction positions "
                             f"(0..{task.n_predictions - 1}, or negative from the end)")
    return task, split, variant


def _group_count(grid: str | None, groups: list, layers, query_positions, key_blocks: int, n_layers: int,
                 n_heads: int) -> int:
    """How many groups a grid of rows or heads, or the --group list, makes."""
    if grid == "rows":
        return len(layers) * len(query_positions) * key_blocks
    if grid == "heads":
        return n_layers * n_heads
    return len(groups)


def plan_patch(
    run: str | Path | ModelSource,
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
) -> PatchPlan | LanguagePatchPlan:
    """The plan of `patch` with these arguments (see there), or the first mistake in them; for a
    pretrained causal LM, `language_plan.plan_language_patch`'s (resample ablation; `task` may give its
    window length, {"seq_len": T}, and is for it alone). device, dtype: where and in what the model runs
    (`validation.check_placement`; None: the CPU, float32)."""
    with about("run_or_model"):
        source = _run_of(run)
    device, dtype = check_placement(device, dtype)
    if source.kind == "pretrained":
        return plan_language_patch(source, task=task, grid=grid, layers=layers, sites=sites,
                                   n=DEFAULT_WINDOWS if n is None else n, split=split, seed=seed, max_groups=max_groups,
                                   attribution=attribution, out=out, overwrite=overwrite, search=search,
                                   groups=groups, variant=variant, prediction=prediction, per_head=per_head,
                                   device=device, dtype=dtype)
    if task is not None:
        with about("task"):
            raise UsageError(f"task {task!r}: a run's task is its own (config.json); task goes with a pretrained "
                             "model (its window length, e.g. seq_len=128)")
    n = DEFAULT_PAIRS if n is None else n
    groups = list(groups or [])
    if sum(bool(choice) for choice in (grid, groups, search)) > 1:
        raise UsageError("give one of --search, --grid or --group")
    if search and attribution:
        raise UsageError("--attribution goes with --grid or --group; --search ranks its candidates by attribution itself "
                         "(the estimates are in <out>.candidates.csv)")
    grid = grid or (None if groups or search else "rows")
    with about("run_or_model"):
        model = checked_model_config(source)
    n_layers, n_heads = int(model["n_layers"]), int(model["n_heads"])
    task, split, variant = _checked_task(source, split, variant, n, prediction)
    partitions = task_partitions(task)
    partition_grid = None
    if grid not in (None, *GRIDS):
        with about("grid"):
            partition_grid = tuple(parse_grid(grid, partitions))
    query_positions, given_layers, layers = None, layers, None
    if search or partition_grid or grid == "rows":
        with about("layers"):
            layers = _layers(given_layers, n_layers)
    if grid == "rows" and not partition_grid:
        with about("queries"):
            query_positions = _queries(queries, task.seq_len)
        if key_blocks > task.seq_len:
            with about("key_blocks"):
                raise UsageError(f"the sequence has {task.seq_len} keys, so at most {task.seq_len} key blocks; got "
                                 f"{key_blocks}")
    elif grid == "heads":
        with about("sites"):
            _resolvable(sites, task, n_layers)
    elif not (search or partition_grid):
        with about("groups"):
            for spec in groups:
                _resolvable(spec, task, n_layers)
    if search:
        cost = _search_cost(len(layers), n, confirm_n)
    else:
        count = (grid_size(partitions, *partition_grid, len(layers), n_heads if per_head else None)
                 if partition_grid else _group_count(grid, groups, layers, query_positions, key_blocks, n_layers,
                                                     n_heads))
        if count > max_groups and not groups:
            with about("grid"):
                raise UsageError(f"grid {grid} makes {count} groups, more than --max-groups {max_groups} (each "
                                 f"costs {len(DONORS)} x --n {n} forward passes); give --max-groups {count} to run "
                                 "them all, or fewer layers, parts or blocks")
        cost = {"groups": count, "examples": len(DONORS) * n * (count + 2)}
    if out is not None:
        with about("out"):
            out = check_output_stem(out, SEARCH_SUFFIXES if search else SUFFIXES, overwrite)
    return PatchPlan(source, task, split, variant, n, seed, prediction, n_layers, n_heads, search, grid, partition_grid,
                     tuple(groups), None if layers is None else tuple(layers),
                     None if query_positions is None else tuple(query_positions), key_blocks, sites, per_head,
                     confirm_n, tolerance, attribution, cost, out, overwrite, device, dtype)


def _run_of(run: str | Path | ModelSource) -> ModelSource:
    """The finished run directory `run` (its task draws the pairs) or a pretrained causal LM (patched by
    resample ablation); a model directory without its run or anything else is refused in one line."""
    from latentcode.rundir import RunDirectoryError

    try:
        source = run if isinstance(run, ModelSource) else locate_model(run)
    except RunDirectoryError:
        source = None
    if source is not None and source.kind == "pretrained":
        return source
    if source is None or source.kind != "run":
        raise UsageError(f"{run} is not a finished run directory (config.json and model/model.safetensors); "
                         "patch reads the task of the run to draw its pairs")
    return source


def _training_variant(source: ModelSource) -> str | None:
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


def _resolvable(spec: str, task: Task, n_layers: int) -> None:
    """Refuse a selector that cannot be read or reaches outside the model or the sequence."""
    try:
        parse_selector(spec, task).resolve(n_layers, task.seq_len)
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

