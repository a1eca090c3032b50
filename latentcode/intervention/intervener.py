"""`Intervention`: the Recorder's twin. A context manager that edits latent codes at selected sites
during forward passes, so that the rest of each layer computes with the edited codes.

    with Intervention(model, ZeroAblate(heads=[0, 3]), sites="last-self"):
        edited_output = model(inputs)

    patch = Interchange.from_inputs(model, source_inputs, sites="last-self")   # activation patching
    with Intervention(model, patch, record="*:-1:-2") as intervention:
        patched_output = model(inputs)
    downstream = intervention.pop()      # {Site: float32 [N, H]}, as Recorder.pop()

Sites and selectors are the Recorder's; each edit applies at the intervention's `sites` unless it names
its own (`ZeroAblate(sites="1:-1:-1")`). Edits run in the order given, each on the output of the one
before. The code is edited after σ and before the value network, through the sources of
`latentcode.sources.source` (docs/how-to/intervene.md says which models each reaches; others raise
`CannotIntervene`). An edit that sets every code to its own value changes no output bit.

`record=` (a selector) records the codes at those sites as this pass computes them: the edited codes
where edited and, downstream, what the edited model computes (a separate `Recorder` active at the same
time is not coordinated with the edit). Hooks (and the SDPA interception) exist only inside the `with`
block and are removed on exit, also when the block raises.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from latentcode.errors import UsageError
from latentcode.extraction.recorder import Recorder
from latentcode.intervention.edits import Edit, EditError
from latentcode.sources.detect import detect_source
from latentcode.sources.site_pairs import SitePairs
from latentcode.sources.sites import Selector, SiteError, parse_selector
from latentcode.sources.source import (
    AttentionSource,
    DifferentiableEditor,
    NoAttentionCaptured,
    PairsFor,
    Sink,
    check_score,
)
from latentcode.store import Site


@dataclass
class _LayerPlan:
    """What happens in one layer on sequences of one length: which pair columns each edit touches."""

    queries: Tensor
    keys: Tensor
    sites: list[Site]
    edits: list[tuple[Edit, Tensor | None, list[Site]]]  # (edit, its columns or None: all in order, their sites)
    record: list[tuple[Sink, Tensor, Tensor, Tensor]]  # (sink, columns, queries, keys) per recorder


class _Tap(AttentionSource):
    """The recorder's source during an intervention: fed by the intervention's own edit hook, so
    that it sees the codes the layer computes with (edited where edited)."""

    def __init__(self, intervention: Intervention):
        self.intervention = intervention
        self.name = intervention.source.name

    def n_layers(self) -> int | None:
        return self.intervention.source.n_layers()

    def layer_names(self) -> list[str] | None:
        return self.intervention.source.layer_names()

    @contextmanager
    def capture(self, pairs_for: PairsFor, score: str, sink: Sink) -> Iterator[None]:
        if check_score(score) != "pattern":
            raise UsageError("an Intervention records latent codes (score='pattern'), not raw scores")
        tap = (pairs_for, sink)
        self.intervention._taps.append(tap)
        try:
            yield
        finally:
            self.intervention._taps.remove(tap)


class Intervention:
    """Edit latent codes at `sites` with `edits` while active (see the module docstring).

    edits: an `Edit` or a list of them (`latentcode.intervention.edits`: `SetCode`, `ZeroAblate`, ...);
        may be reassigned between forward passes (`intervention.edits = ...`).
    sites: where edits without their own `sites` apply; a selector spec, a `Selector` or a list.
    source: where attention is edited; detected from the model when not given.
    task_config: places the `sraven-rule` sites.
    record: a selector; if given, the codes at those sites are recorded in the same pass (`pop()`).
    """

    def __init__(
        self,
        model: nn.Module,
        edits: Edit | Sequence[Edit],
        sites: str | Selector | Sequence = "last-self",
        source: AttentionSource | None = None,
        task_config: dict | None = None,
        record: str | Selector | Sequence | None = None,
    ):
        self.model = model
        self.task_config = task_config
        self.selector = parse_selector(sites, task_config)
        self.source = source if source is not None else detect_source(model)
        self._site_pairs: dict[Selector, SitePairs] = {}
        self._plans: dict[tuple[int, int], _LayerPlan] = {}
        self._plan_of_layer: dict[int, _LayerPlan] = {}
        self._taps: list[tuple[PairsFor, Sink]] = []
        self.edits = edits
        self.recorder = None if record is None else Recorder(model, record, source=_Tap(self), task_config=task_config)
        self._layers_seen: set[int] = set()
        self._handles: list = []
        self._editing = None

    # -- edits -------------------------------------------------------------------------------------
    @property
    def edits(self) -> tuple[Edit, ...]:
        return self._edits

    @edits.setter
    def edits(self, edits: Edit | Sequence[Edit]) -> None:
        edits = (edits,) if isinstance(edits, Edit) else tuple(edits)
        for edit in edits:
            if not isinstance(edit, Edit):
                raise TypeError(f"an edit is a latentcode.intervention Edit (ZeroAblate, SetCode, ...), got {edit!r}")
        self._edits = edits
        self._plans = {}
        for edit in edits:
            self._pairs_of(edit)  # checks the edit's sites against the model now, where it can

    def _pairs_of(self, edit: Edit) -> SitePairs:
        selector = self.selector if edit.sites is None else parse_selector(edit.sites, self.task_config)
        if selector not in self._site_pairs:
            self._site_pairs[selector] = SitePairs(selector, self.source.n_layers(), self.source.name)
        return self._site_pairs[selector]

    # -- what each layer edits ---------------------------------------------------------------------
    def _pairs_for(self, layer: int, seq_len: int, n_queries: int | None = None) -> tuple[Tensor, Tensor] | None:
        """The union of the pairs every edit and recorder asks for in `layer` (the source's pairs_for);
        `n_queries` where the query axis differs from the key axis (cross-attention)."""
        key = (layer, seq_len, n_queries)
        if key not in self._plans:  # cleared when the edits change and on entering
            record_pairs = [(sink, pairs_for(layer, seq_len, n_queries)) for pairs_for, sink in self._taps]
            self._plans[key] = self._plan(layer, seq_len, record_pairs, n_queries)
        plan = self._plans[key]
        self._plan_of_layer[layer] = plan
        return None if plan is None else (plan.queries, plan.keys)

    def _plan(self, layer: int, seq_len: int, record_pairs: list, n_queries: int | None = None) -> _LayerPlan | None:
        column_of: dict[tuple[int, int], int] = {}

        def columns(pairs: tuple[Tensor, Tensor]) -> Tensor:
            indices = [column_of.setdefault(pair, len(column_of))
                       for pair in zip(*(p.tolist() for p in pairs), strict=True)]
            return torch.tensor(indices)

        edits = []
        for edit in self._edits:
            pairs = self._pairs_of(edit)(layer, seq_len, n_queries)
            if pairs is not None:
                edits.append((edit, columns(pairs), [Site(layer, q, k)
                                                     for q, k in zip(*(p.tolist() for p in pairs), strict=True)]))
        record = [(sink, columns(pairs), *pairs) for sink, pairs in record_pairs if pairs is not None]
        if not column_of:
            return None
        every_column = torch.arange(len(column_of))
        edits = [(edit, None if torch.equal(cols, every_column) else cols, sites) for edit, cols, sites in edits]
        queries, keys = (torch.tensor(positions) for positions in zip(*column_of, strict=True))
        return _LayerPlan(queries, keys, [Site(layer, q, k) for q, k in column_of], edits, record)

    def _edit(self, layer: int, queries: Tensor, keys: Tensor, codes: Tensor) -> Tensor:
        """The editor given to the source: codes `[batch, head, n]` of the plan's pairs -> edited."""
        plan = self._plan_of_layer[layer]
        self._layers_seen.add(layer)
        edited = codes
        for edit, columns, sites in plan.edits:
            if columns is None:
                edited = edit(edited, sites)
            else:
                columns = columns.to(edited.device)
                edited = edited.index_copy(2, columns, edit(edited.index_select(2, columns), sites).to(edited.dtype))
            if edited.shape != codes.shape:
                raise EditError(f"{type(edit).__name__} returned codes of shape {tuple(edited.shape)}; expected "
                                f"{tuple(codes.shape)}")
        for sink, columns, record_queries, record_keys in plan.record:
            sink(layer, record_queries, record_keys, edited[:, :, columns.to(edited.device)].detach().float())
        return edited

    # -- forward passes ----------------------------------------------------------------------------
    def _before_forward(self, module, args, kwargs) -> None:
        self._layers_seen = set()
        for edit in self._edits:
            edit.check_call(args, kwargs)

    def _after_forward(self, module, args, output) -> None:
        n_layers = self.source.n_layers()  # a TorchAttentionSource knows it once a pass has run
        for pairs in self._site_pairs.values():
            missing = sorted(layer for layer in pairs.wanted_layers() if n_layers is not None and layer >= n_layers)
            if missing:
                raise SiteError(
                    f"sites in layer(s) {missing} were selected but the model ran only {n_layers} attention layers"
                )
        if not self._layers_seen and self._edits:
            raise NoAttentionCaptured(
                f"no latent code was edited in {type(self.model).__name__} ({self.source.name} source): the model "
                "made no attention call the source can edit at the selected sites, or the selected layers never ran"
            )

    def __enter__(self) -> Intervention:
        self._plans = {}
        carries_gradient = any(edit.carries_gradient() for edit in self._edits)
        editor = DifferentiableEditor(self._edit) if carries_gradient else self._edit
        self._editing = self.source.edit(self._pairs_for, editor)
        self._editing.__enter__()
        try:
            # After the source's own hooks, so that a TorchAttentionSource has counted the pass's layers.
            self._handles = [
                self.model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
                self.model.register_forward_hook(self._after_forward),
            ]
            if self.recorder is not None:
                self.recorder.__enter__()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            if self.recorder is not None:
                self.recorder.__exit__(exc_type, exc, traceback)
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            editing, self._editing = self._editing, None
            if editing is not None:
                editing.__exit__(exc_type, exc, traceback)

    # -- recorded codes ----------------------------------------------------------------------------
    def _recorder(self) -> Recorder:
        if self.recorder is None:
            raise UsageError("this Intervention records nothing; pass record=SITES to record codes in the same pass")
        return self.recorder

    def codes(self) -> dict[Site, np.ndarray]:
        """`{site: float32 [N, H]}` recorded at `record` so far (edited codes where edited)."""
        return self._recorder().codes()

    def pop(self) -> dict[Site, np.ndarray]:
        """Like `codes()`, then forget them."""
        return self._recorder().pop()

