"""`Recorder`: a context manager that records latent codes at selected sites during forward passes.

    with Recorder(model, "last-self") as recorder:       # or sites=[(0, -1, -1), ...]
        model(inputs_1)
        model(inputs_2)
    codes = recorder.pop()        # {Site(layer, query, key): float32 [N, H]}, N over both passes

Works for any model a source can read (`latentcode.sources.source`). Only the selected entries are
kept, sliced while the forward pass runs; on hook points the hooks are `QueryBlockHook`s, to which our
attention layers hand long sequences a block of queries at a time, so recording never assembles the
whole `[batch, head, query, key]` pattern (`latentcode.models.attention`).

Hooks run in the order they were added: a Recorder reads a hook point's value before any hook
added after it (e.g. a patching hook of a later `run_with_hooks`) changes it, and after hooks that
were already there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from contextlib import ExitStack

import numpy as np
from torch import Tensor, nn

from latentcode.sources.detect import detect_source
from latentcode.sources.site_pairs import SitePairs
from latentcode.sources.sites import Selector, parse_selector
from latentcode.sources.source import (
    AttentionSource,
    NoAttentionCaptured,
    check_score,
    removed_on_exit,
)
from latentcode.store import Site


def attention_like_modules(model: nn.Module, shown: int = 4) -> str:
    """The model's modules whose names look like attention, for an error message."""
    from latentcode.sources.softmax_capture import ATTENTION_NAMES

    names = [name for name, _ in model.named_modules() if name and ATTENTION_NAMES.fullmatch(name)]
    if not names:
        return "none of its modules is named like attention; list them with model.named_modules()"
    more = f", ... ({len(names)} in all)" if len(names) > shown else ""
    return f"modules named like attention: {', '.join(names[:shown])}{more}"


class Recorder:
    """Record the latent codes (`score="pattern"`) or raw scores (`score="scores"`) at `sites`.

    sites: a selector spec (`"last-self"`, `"sraven-rule"`, `"all-pairs:0"`, `"0:-1:-1,1:35:27"`),
        a `Selector`, or a list of `Site`s / (layer, query, key) tuples; negative positions count
        from the end. `task_config` places the `sraven-rule` sites.
    source: where to read attention from; detected from the model when not given.
    """

    def __init__(
        self,
        model: nn.Module,
        sites: str | Selector | Sequence = "last-self",
        score: str = "pattern",
        source: AttentionSource | None = None,
        task_config: dict | None = None,
    ):
        self.model = model
        self.score = check_score(score)
        self.selector = parse_selector(sites, task_config)
        self.source = source if source is not None else detect_source(model)
        self.n_layers = self.source.n_layers()
        self.pairs_for = SitePairs(self.selector, self.n_layers, self.source.name)
        self.n_heads: int | None = None
        self._finished: dict[Site, list[np.ndarray]] = defaultdict(list)
        self._layers_seen: set[int] = set()
        self._pass = 0  # forward passes seen by the root module's pre-hook
        self._pass_of_last: dict[Site, int] = {}
        self._hooked: ExitStack | None = None  # the hooks and the source's capture, while recording

    # -- capture ------------------------------------------------------------------------------------
    def _sink(self, layer: int, queries: Tensor, keys: Tensor, codes: Tensor) -> None:
        if self.n_heads is None:
            self.n_heads = codes.shape[1]
        self._layers_seen.add(layer)
        codes = codes.float().cpu().numpy()  # float32 whatever the model computes in
        for index, (query, key) in enumerate(zip(queries.tolist(), keys.tolist(), strict=True)):
            site = Site(layer, query, key)
            if self._pass > 0 and self._pass_of_last.get(site) == self._pass:
                # The same layer reported twice in one pass (a module called again): keep the last.
                self._finished[site][-1] = codes[:, :, index]
            else:
                self._finished[site].append(codes[:, :, index])
                self._pass_of_last[site] = self._pass

    # The root module's forward hooks delimit and check a pass; codes are stored by the sink
    # directly, so recording also works when a wrapper calls `model.forward(...)` without them
    # (TransformerLens's run_with_hooks): then every report is kept.
    def _before_forward(self, module, args) -> None:
        self._layers_seen = set()
        self._pass += 1

    def _after_forward(self, module, args, output) -> None:
        if not self._layers_seen:
            raise NoAttentionCaptured(
                f"no latent code was captured from {type(self.model).__name__} ({self.source.name} source): "
                "it has no HookPoint named blocks.<layer>.attn.hook_pattern and made no call to "
                "scaled_dot_product_attention or nn.MultiheadAttention that could be intercepted, or the "
                "selected layers never ran; for attention written by hand (matmul, softmax) use "
                f"latentcode.sources.SoftmaxSource(model, r'NAME_PATTERN') naming the modules that compute "
                f"the softmax ({attention_like_modules(self.model)}), and for other attention code "
                "latentcode.sources.AdapterSource"
            )
        self.pairs_for.check_ran(self._layers_seen)

    def __enter__(self) -> Recorder:
        with ExitStack() as stack:  # on a failure here, what was set up is undone
            handles = stack.enter_context(removed_on_exit())
            handles += [self.model.register_forward_pre_hook(self._before_forward),
                        self.model.register_forward_hook(self._after_forward)]
            stack.enter_context(self.source.capture(self.pairs_for, self.score, self._sink))
            self._hooked = stack.pop_all()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        hooked, self._hooked = self._hooked, None
        if hooked is not None:  # the capture ends, then the hooks go
            hooked.__exit__(exc_type, exc, traceback)

    # -- results ------------------------------------------------------------------------------------
    @property
    def sites(self) -> list[Site]:
        return sorted(self._finished)

    def layers(self) -> list[dict] | None:
        """Per attention layer of the last pass, where the source knows it: `{"name", "kind" ("self" or
        "cross"), "queries", "keys"}`; pass it to `CodeWriter` as `metadata["attention_layers"]`."""
        return self.source.layers()

    def codes(self) -> dict[Site, np.ndarray]:
        """`{site: float32 [N, H]}` over every forward pass recorded so far."""
        return {site: np.concatenate(self._finished[site], axis=0) for site in self.sites}

    def pop(self) -> dict[Site, np.ndarray]:
        """Like `codes()`, then forget them (for streaming batch after batch)."""
        codes = self.codes()
        self._finished = defaultdict(list)
        self._pass_of_last = {}
        return codes
