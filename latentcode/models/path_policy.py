"""Which path computes an attention layer's z: from what its sigma and value network declare they
are, the hooks attached, the sequence length and the mode; never from their names.

The paths (computed in `latentcode.models.attention_paths`, all equal to float tolerance in outputs
and gradients, tests/models/test_attention_paths.py; `why_not` says what each needs):

    full         the formulas, every `[batch, head, query, key]` tensor held whole
    blockwise    one block of queries at a time (sigma acts on each query row alone)
    sdpa         `F.scaled_dot_product_attention` (softmax scores, the linear value network)
    associative  q (k^T v) (identity scores, the linear value network, no relative position bias)
    fused        one C++ kernel per batch element from queries to z (`latentcode.models.fused_short`)

sdpa and associative have no attention dropout of ours (one `[query, key]` mask): they need eval
mode or attn_dropout 0.

"auto" takes the full path below `AUTO_MIN_POSITIONS` positions in evaluation (bit for bit the
computation that trained the shipped checkpoints and computed their results); in training mode there
it takes the fused path where it can and no hook reads scores, codes or the value network, else the
full path. It takes the full path whenever a hook needs a whole tensor (any hook on hook_attn_scores /
hook_pattern but a `QueryBlockHook`, any hook in the value network, a global module hook); otherwise
sdpa or associative where they apply and no QueryBlockHook reads the pattern, else blockwise where
sigma allows, else full. So attaching a hook to a long sequence can move a layer from a faster path
to the full one: its numbers then change by float rounding only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from torch import nn

from latentcode.errors import LatentcodeError
from latentcode.models import fused_short
from latentcode.models.attention_paths import Reader
from latentcode.models.hook_state import any_hooks, attached_hooks, global_hooks_attached
from latentcode.models.query_block_hook import QueryBlockHook

if TYPE_CHECKING:
    from latentcode.models.attention import Attention

PATHS = ("auto", "full", "blockwise", "sdpa", "associative", "fused")
AUTO_MIN_POSITIONS = 128
"""Below this many positions "auto" takes the full path (its T^2 tensors are small there)."""


class AttentionPathError(LatentcodeError, ValueError):
    """A path that cannot compute this layer, or a block size that is not a positive integer."""


class PathChoice(NamedTuple):
    """The path of one forward pass and the `QueryBlockHook` reads its blocks feed (blockwise only)."""

    path: str
    score_readers: tuple[Reader, ...] = ()
    pattern_readers: tuple[Reader, ...] = ()


def choose_path(layer: Attention, n_positions: int) -> PathChoice:
    """The path that computes `layer` over `n_positions` positions now: `layer.path` where it can
    (else `AttentionPathError` saying why not), or for "auto" as the module docstring says."""
    score_readers = block_readers(layer.hook_attn_scores)
    pattern_readers = block_readers(layer.hook_pattern)
    needs_whole = (score_readers is None or pattern_readers is None or any_hooks(layer.value_network.modules())
                   or global_hooks_attached())
    needs_pattern = bool(score_readers or pattern_readers)
    path = layer.path
    if path == "auto":
        if needs_whole or n_positions < AUTO_MIN_POSITIONS:
            if layer.training and not (needs_whole or needs_pattern) and why_not(layer, "fused", n_positions) is None:
                return PathChoice("fused")
            return PathChoice("full")
        for fast_path in ("sdpa", "associative"):
            if not needs_pattern and why_not(layer, fast_path) is None:
                return PathChoice(fast_path)
        if why_not(layer, "blockwise") is None:
            return PathChoice("blockwise", score_readers, pattern_readers)
        return PathChoice("full")
    if path == "full":
        return PathChoice("full")
    if needs_whole:
        raise AttentionPathError(f"attention path {path!r} cannot run while a hook needs the whole scores, pattern or "
                                 "hidden tensor (only QueryBlockHooks on hook_attn_scores / hook_pattern read blocks); "
                                 "remove the hook or use path 'auto' or 'full'")
    if path != "blockwise" and needs_pattern:
        reason = "a QueryBlockHook reads the pattern, which it never computes"
    else:
        reason = why_not(layer, path, n_positions)
    if reason is not None:
        raise AttentionPathError(f"attention path {path!r} cannot compute this layer: {reason}")
    return PathChoice(path, score_readers, pattern_readers)


def why_not(layer: Attention, path: str, n_positions: int = 0) -> str | None:
    """Why `path` ("blockwise", "sdpa", "associative" or "fused") cannot compute `layer` over `n_positions`
    positions now, or None if it can."""
    sigma, value_network = layer.normalization, layer.value_network
    pair = f"{layer.score_normalization} + {value_network.config_name}"
    if path == "fused":
        if sigma.fused_code is None or value_network.fused_code is None:
            return ("its kernel computes softmax/identity/rms_head scores with a linear or hyper value network, this "
                    f"layer has {pair}")
        return fused_short.why_not(layer.W_Q, n_positions)
    if path == "blockwise":
        if not sigma.acts_per_query:
            return f"its score normalization does not act on each query row alone, this layer has {pair}"
        return None
    if layer.training and layer.attn_dropout > 0:
        return (f"it has no attention dropout of ours (one [query, key] mask), and this layer is in training mode "
                f"with attn_dropout={layer.attn_dropout}; use eval mode or attn_dropout 0")
    if path == "sdpa" and not (sigma.is_softmax_over_keys and value_network.is_weighted_sum_of_values):
        return f"it needs softmax scores and the linear value network, this layer has {pair}"
    if path == "associative":
        if not (sigma.is_identity and value_network.is_weighted_sum_of_values):
            return f"it needs identity scores and the linear value network, this layer has {pair}"
        if layer.relative_position_bias is not None:
            return "it needs positions 'rotary' or 'none', this layer has relative position bias"
    return None


def block_readers(hook_point: nn.Module) -> tuple[Reader, ...] | None:
    """The `read` functions of the `QueryBlockHook`s on `hook_point`, or None when another hook is
    there (a forward hook of another kind, a pre-hook or a backward hook): it needs the whole tensor."""
    hooks = attached_hooks(hook_point)
    if hooks.forward_pre or hooks.backward or hooks.backward_pre or not all(
            isinstance(hook, QueryBlockHook) for hook in hooks.forward):
        return None
    return tuple(hook.read for hook in hooks.forward)
