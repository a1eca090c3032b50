"""`plan_language_patch`: a resample-ablation sweep of a pretrained causal LM, checked before torch.

    plan = plan_patch("smollm2", task={"seq_len": 128}, n=32, layers=[3, 10])   # this plan (via plan_patch)
    result = patch(plan)                                  # latentcode.intervention.patching.language_patch

A text corpus has no counterfactual pairs, so a pretrained model is patched by *resample ablation*:
each base window gets a donor window of the same split and length (a seeded derangement: never
itself), and group g takes the donor's codes a[h, q, k] at its sites in place of the base's. The
groups are the heads grid (each (layer, head) of `layers` at the pairs of `sites`, default every
pair) or the offsets grid (per layer each relative-offset band of BANDS, every head: not a product of
a query set and a key set, so each is its list of (query, key) pairs). Checked here, with one message from Python and the command line: the model (metadata only),
the split, the window length against the model's context, n >= 2 (a derangement), the layers and
sites against the model and the window, the number of groups against `max_groups`, the memory of a
pass's logits, the output stem; and the options that only a run's task can give (--search, rows or
partition grids, --group, --variant, --prediction) are refused in one line saying why. JSON and
numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latentcode.errors import UsageError, about
from latentcode.pretrained import AttentionShape, attention_shape
from latentcode.rundir import ModelSource
from latentcode.sources.sites import layers_and_first_query, parse_selector
from latentcode.validation import check_fits_in_memory, check_integer, check_output_stem

GRIDS = ("heads", "offsets")
DEFAULT_SEQ_LEN = 128
SUFFIXES = (".csv", ".json", ".png")
# Tokens a whole sweep may run through the model (window passes x seq_len), refused up front as the trained
# path refuses groups beyond --max-groups: 2^28 tokens are about 7 hours of SmolLM2-135M at 10^4 tokens a second.
MAX_PATCH_TOKENS = 2**28
MAX_TOKENS_PER_PASS = 4096  # windows x tokens of one patched pass (its logits: 4096 x vocabulary floats)
LOGIT_BYTES_PER_TOKEN = 3 * 4 * 65_536  # logits, their log-softmax and a copy, float32, a vocabulary up to 64k

# Relative-offset bands of the causal pairs (k <= q), disjoint and covering them all.
BANDS = ("sink k=0", "self k=q", "previous k=q-1", "k=q-4..q-2", "further 0<k<q-4")


def band_pairs(band: str, seq_len: int) -> list[tuple[int, int]]:
    """The (query, key) pairs of an offset band (BANDS) in a window of `seq_len` tokens."""
    def keys(query: int) -> range:
        return {"sink k=0": range(0, 1 if query > 0 else 0), "self k=q": range(query, query + 1),
                "previous k=q-1": range(query - 1, query) if query >= 2 else range(0),
                "k=q-4..q-2": range(max(1, query - 4), max(1, query - 1)),
                "further 0<k<q-4": range(1, max(1, query - 4))}[band]
    return [(query, key) for query in range(seq_len) for key in keys(query)]


def offset_groups(seq_len: int) -> int:
    """Groups of one layer of the offsets grid: each band, and a control for each band that leaves at
    least as many causal pairs outside it."""
    causal = seq_len * (seq_len + 1) // 2
    sizes = [len(band_pairs(band, seq_len)) for band in BANDS]
    return len(BANDS) + sum(causal - size >= size for size in sizes)


@dataclass(frozen=True)
class LanguagePatchPlan:
    """Resample ablation of the pretrained model at `source`: `n` windows of `seq_len` tokens of the
    corpus's `split`, each with a donor window (seed `seed`), patched at each (layer, head) of `layers`
    at the pairs of `sites`; the effect read on the next-token loss from position `first_query` (the
    first query a group touches) on, in passes of `batch_size` windows; beside each group a control:
    another head of the same layer drawn at random (seed `seed`), patched from the same donors.
    `attribution`: gradient x (donor - base) codes per group too. `cost`: groups and window passes."""

    source: ModelSource
    name: str
    shape: AttentionShape
    split: str
    seq_len: int
    n: int
    seed: int
    layers: tuple[int, ...]
    sites: str
    first_query: int
    batch_size: int
    attribution: bool
    cost: Mapping[str, int]
    out: Path | None = None
    overwrite: bool = False
    grid: str = "heads"
    search: bool = False
    suffixes: tuple[str, ...] = SUFFIXES
    device: str | None = None  # where and in what the model runs (None: the CPU, float32)
    dtype: str | None = None


def plan_language_patch(
    source: ModelSource,
    *,
    task: Mapping[str, Any] | None = None,
    grid: str | None = None,
    layers: str | Sequence[int] | None = None,
    sites: str = "*:*:*",
    n: int = 32,
    split: str | None = None,
    seed: int = 0,
    max_groups: int = 256,
    attribution: bool = False,
    out: str | Path | None = None,
    overwrite: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    **run_only: Any,
) -> LanguagePatchPlan:
    """The plan (see the module docstring) or the first mistake. `run_only`: `plan_patch`'s options
    that need a run's task, refused here unless left at their defaults."""
    from latentcode.intervention.patching.plan import _layers

    name = str(source.path)
    if run_only.get("search"):
        with about("search"):
            raise UsageError(f"it finds a group by the transfer of a sub-task between counterfactual pairs of a "
                             f"run's task; {name} reads windows of text, which have none: sweep its heads with --grid "
                             "heads (resample ablation)")
    for option, default in (("groups", None), ("variant", None), ("prediction", -1), ("per_head", False)):
        if run_only.get(option) not in (default, [], ()):
            with about(option):
                raise UsageError(f"{option} {run_only[option]!r} needs a run's task; {name} is a pretrained model, "
                                 "patched by resample ablation over --grid heads (--layers, --sites, --task seq_len=T)")
    if grid not in (None, *GRIDS):
        with about("grid"):
            raise UsageError(f"grid {grid!r}: a pretrained model is patched by (layer, head) (--grid heads) or by "
                             "relative-offset band (--grid offsets); rows and the task's partitions need a run's task")
    grid = grid or "heads"
    if grid == "offsets" and sites != "*:*:*":
        with about("sites"):
            raise UsageError(f"sites {sites!r}: the offsets grid makes its own pairs (each band of every query); "
                             "leave --sites out")
    with about("run_or_model"):
        shape = attention_shape(source.path)
    with about("n"):
        n = check_integer("n", n, minimum=1)
        if n < 2:
            raise UsageError(f"n={n}: resample ablation needs at least 2 windows (each takes the codes of another)")
    with about("seed"):
        seed = check_integer("seed", seed, minimum=0)
    from latentcode.subject import subject_of

    windows = subject_of(source).task(task, DEFAULT_SEQ_LEN)  # interim, until patch is merged into one plan
    split, seq_len = windows.check_split(split), windows.seq_len
    with about("layers"):
        layers = _layers(layers, shape.n_layers)
    with about("sites"):
        site_layers, first_query = layers_and_first_query(parse_selector(sites), shape.n_layers, seq_len)
        layers = sorted(set(layers) & set(site_layers))
        if not layers:
            raise UsageError(f"sites {sites!r} name none of the layers swept; give sites such as *:*:* (every pair of "
                             "each layer) or LAYER:*:* with --layers LAYER")
    groups = len(layers) * (shape.n_heads if grid == "heads" else offset_groups(seq_len))
    if groups > max_groups:
        with about("layers"):
            raise UsageError(f"{len(layers)} layers make {groups} groups, more than "
                             f"--max-groups {max_groups}; give --max-groups {groups} to run them all, or fewer layers")
    batch_size = min(n, max(1, MAX_TOKENS_PER_PASS // seq_len))
    with about("n"):
        check_fits_in_memory(LOGIT_BYTES_PER_TOKEN * batch_size * seq_len,
                             f"passes of {batch_size} windows of {seq_len} tokens (their logits)")
    batches = -(-n // batch_size)
    cost = {"groups": groups, "window_passes": n * (groups + 2), "passes": batches * (groups + 2)}
    if cost["window_passes"] * seq_len > MAX_PATCH_TOKENS:
        with about("n"):
            raise UsageError(f"n={n} windows x ({groups} groups + 2) passes x {seq_len} tokens is "
                             f"{cost['window_passes'] * seq_len:,} tokens through the model, beyond the budget of "
                             f"{MAX_PATCH_TOKENS:,} (hours of a CPU); give a smaller --n, fewer --layers "
                             "or a shorter --task seq_len")
    if out is not None:
        with about("out"):
            out = check_output_stem(out, SUFFIXES, overwrite)
    return LanguagePatchPlan(source, name, shape, split, seq_len, n, seed, tuple(layers), sites, first_query,
                             batch_size, attribution, cost, out, overwrite, grid,
                             device=device, dtype=dtype)
