"""Multi-head attention as a score normalization sigma composed with a value network.

    q, k, v        = x W_Q + b_Q, x W_K + b_K, x W_V + b_V        [batch, pos, head, d_head(_v)]
    scores[h,q,k]  = q[q,h] . k[k,h] / sqrt(d_head) + position_bias[h,q,k]
    a              = sigma(scores)                                 the latent codes, hook_pattern
    z              = value_network(a, v)                           [batch, query, head, d_head_v]
    out[q]         = sum_h z[q,h] W_O[h] + b_O

Parameters carry TransformerLens's names and shapes: `W_Q, W_K` `[n_heads, d_model, d_head]`,
`W_V` `[n_heads, d_model, d_head_v]`, `W_O` `[n_heads, d_head_v, d_model]`, `b_Q, b_K`
`[n_heads, d_head]`, `b_V` `[n_heads, d_head_v]`, `b_O` `[d_model]`.

The scores, sigma and dropout are written once, in `latentcode.models.scores`, for every path.

Attention dropout (training mode only) multiplies the latent codes after `hook_pattern`, so
recorded codes are never dropped out. As in the authors' public configuration (Flax's
`broadcast_dropout=True`), one dropout mask `[query, key]` is shared by all batch elements and
heads of a forward pass: a dropped pair loses its whole latent code.

Paths. The layer computes z in one of five ways, all equal to float tolerance in outputs and
gradients (`latentcode.models.attention_paths`); `Attention.path` (default "auto") or the
context manager `attention_path(model, path)` chooses:

    full         the formulas above, every `[batch, head, query, key]` tensor (and, for the hyper_*
                 value networks, `[batch, query, key, d_head_v]`) held whole, forward and backward
    blockwise    one block of queries at a time (key tiles inside for the hyper_* value networks);
                 the backward recomputes each block: memory O(T) beyond q, k, v and the dropout mask
    sdpa         softmax + linear value network: F.scaled_dot_product_attention
    associative  identity + linear value network without relative positions: q (k^T v), chunked
                 when causal: O(T d^2) time, no T^2 tensor

"auto" takes the full path for sequences shorter than `AUTO_MIN_POSITIONS` (bit for bit the
computation that trained the shipped checkpoints, and the fastest there) and whenever a hook needs
a whole tensor; otherwise sdpa or associative where they apply and no hook needs the pattern
(both need eval mode or attn_dropout 0: SDPA's dropout draws one mask per batch and head, ours
one [query, key] mask), else blockwise. `query_block_size` (None: chosen so that a block's codes
take about 2 MiB) sets the queries per block.

What each hook costs (hook points of this layer):

    hook_q, hook_k, hook_v, hook_rot_q, hook_rot_k, hook_z
                        nothing: [batch, pos, ...] tensors, whole in every path
    hook_attn_scores, hook_pattern
                        a `QueryBlockHook` (read only; the Recorder's site recording uses it):
                        nothing, it reads each block `[batch, head, block, key]` with its first
                        query (a causal block pads its masked keys: codes 0; a reader of the scores
                        makes each block also score its masked keys). Any other hook (TransformerLens
                        hooks, run_with_cache, interventions that edit codes, backward hooks): the
                        full path, T^2 floats per batch element and head, forward and backward
    value_network.hook_hidden, hook_hidden2 (hyper_*), or any hook on the value network module
                        the full path, with whole hidden activations `[batch, query, key, d_head_v]`
                        (T^2 d_head_v floats per batch element each, several kept for the backward)

What the full path costs where a faster one exists (benchmarks/bench_long_sequences.py; 2 layers,
d_model 256, 4 heads of width 64, batch 2, T=1024, causal, one forward+backward on one CPU
thread): HYLA 3.0 GB and 5.7x the time of the blockwise path (0.09 GB); softmax 2.1x the memory
and 1.6x the time of sdpa; linear 1.8x the memory and 1.8x the time of the associative form.

Global module hooks (`torch.nn.modules.module.register_module_forward_hook` and friends) also
select the full path: they would see blocks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from latentcode.errors import LatentcodeError
from latentcode.models.attention_paths import associative_z, blockwise_z, plan_blocks, sdpa_z
from latentcode.models.config import ModelConfig
from latentcode.models.hook_state import any_hooks, attached_hooks, global_hooks_attached
from latentcode.models.hooks import HookPoint
from latentcode.models.normalization import SCORE_NORMALIZATIONS
from latentcode.models.positions import RelativePositionBias, Rotary
from latentcode.models.query_block_hook import QueryBlockHook
from latentcode.models.scores import ScoresToCodes, drop_out, dropout_mask
from latentcode.models.value_network import VALUE_NETWORKS

PATHS = ("auto", "full", "blockwise", "sdpa", "associative")
AUTO_MIN_POSITIONS = 128
"""Below this many positions "auto" takes the full path (its T^2 tensors are small there)."""


class InputShapeError(LatentcodeError, ValueError):
    """An input that does not match the model; the message names the expected and received shape."""


class AttentionPathError(LatentcodeError, ValueError):
    """A path that cannot compute this layer, or a block size that is not a positive integer."""


# The standard deviation of a unit normal truncated at ±2: dividing by it gives the truncated draw
# variance 1 (Flax's variance_scaling divides by the same constant, 0.87962566103423978).
UNIT_NORMAL_TRUNCATED_AT_2_STD = 0.87962566103423978


def lecun_normal_(weight: Tensor, fan_in: int) -> Tensor:
    """A normal truncated at ±2 standard deviations and rescaled so that the draw has variance 1 / fan_in:
    Flax's `lecun_normal`, the authors' kernel init. (Truncating a normal of std 1/sqrt(fan_in) without
    the rescaling gives variance 0.774 / fan_in.)"""
    std = 1.0 / math.sqrt(fan_in) / UNIT_NORMAL_TRUNCATED_AT_2_STD
    return nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        sizes = config.sizes
        self.config = config
        self.n_heads, self.d_head, self.d_head_v = sizes.n_heads, sizes.d_head, sizes.d_head_v
        d_model = sizes.d_model

        self.W_Q = nn.Parameter(lecun_normal_(torch.empty(self.n_heads, d_model, self.d_head), d_model))
        self.W_K = nn.Parameter(lecun_normal_(torch.empty(self.n_heads, d_model, self.d_head), d_model))
        self.W_V = nn.Parameter(lecun_normal_(torch.empty(self.n_heads, d_model, self.d_head_v), d_model))
        self.W_O = nn.Parameter(
            lecun_normal_(torch.empty(self.n_heads, self.d_head_v, d_model), self.n_heads * self.d_head_v)
        )
        self.b_Q = nn.Parameter(torch.zeros(self.n_heads, self.d_head))
        self.b_K = nn.Parameter(torch.zeros(self.n_heads, self.d_head))
        self.b_V = nn.Parameter(torch.zeros(self.n_heads, self.d_head_v))
        self.b_O = nn.Parameter(torch.zeros(d_model))

        self.score_normalization = config.score_normalization
        self.normalize = SCORE_NORMALIZATIONS[self.score_normalization]
        self.value_network = VALUE_NETWORKS[config.value_network](self.n_heads, self.d_head_v)
        self.attn_dropout = config.attn_dropout
        self.rms_head_eps = config.rms_head_eps

        self.relative_position_bias = (
            RelativePositionBias(self.n_heads, config.n_ctx) if config.positions == "relative" else None
        )
        self.rotary = (
            Rotary(self.d_head, config.n_ctx, config.rotary_base) if config.positions == "rotary" else None
        )
        if config.causal:
            allowed = torch.ones(config.n_ctx, config.n_ctx, dtype=torch.bool).tril()
            self.register_buffer("allowed", allowed, persistent=False)
        else:
            self.allowed = None

        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, head, d_head_v]
        if self.rotary is not None:
            self.hook_rot_q = HookPoint()  # [batch, pos, head, d_head]
            self.hook_rot_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_pos], before sigma
        self.hook_pattern = HookPoint()  # [batch, head, query_pos, key_pos], the latent codes
        self.hook_z = HookPoint()  # [batch, pos, head, d_head_v]
        self.path = "auto"
        self.query_block_size = None
        self.last_path: str | None = None  # the path of the last forward pass, for tests and benchmarks

    @property
    def path(self) -> str:
        """How z is computed: one of `PATHS` (see the module docstring); "auto" chooses."""
        return self._path

    @path.setter
    def path(self, path: str) -> None:
        if path not in PATHS:
            raise AttentionPathError(f"unknown attention path {path!r}; expected one of {PATHS}")
        self._path = path

    @property
    def query_block_size(self) -> int | None:
        """Queries per block of the blockwise path; None: chosen from the sequence length."""
        return self._query_block_size

    @query_block_size.setter
    def query_block_size(self, size: int | None) -> None:
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
            raise AttentionPathError(
                f"query_block_size must be a positive integer (queries per block) or None (chosen "
                f"from the sequence length), got {size!r}"
            )
        self._query_block_size = size

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys, values `[batch, pos, head, d]` from the attention input `[batch, pos, d_model]`.

        One matrix product for all three (the weights are concatenated on the fly, a small copy).
        """
        batch, n_positions, d_model = x.shape
        h, dk, dv = self.n_heads, self.d_head, self.d_head_v
        weight = torch.cat(
            [w.permute(1, 0, 2).reshape(d_model, -1) for w in (self.W_Q, self.W_K, self.W_V)], dim=1
        )
        bias = torch.cat([self.b_Q.reshape(-1), self.b_K.reshape(-1), self.b_V.reshape(-1)])
        qkv = torch.addmm(bias, x.reshape(-1, d_model), weight).view(batch, n_positions, -1)
        q, k, v = qkv.split([h * dk, h * dk, h * dv], dim=-1)
        return (
            q.view(batch, n_positions, h, dk),
            k.view(batch, n_positions, h, dk),
            v.view(batch, n_positions, h, dv),
        )

    def forward(self, x: Tensor) -> Tensor:
        """x: the attention input `[batch, pos, d_model]` -> attention output `[batch, pos, d_model]`."""
        batch, n_positions, _ = x.shape
        if n_positions > self.config.n_ctx:
            raise InputShapeError(
                f"attention input has {n_positions} positions but the layer accepts at most "
                f"n_ctx={self.config.n_ctx} (shape {list(x.shape)}); build the model with a larger n_ctx"
            )
        q, k, v = self.project_qkv(x)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if self.rotary is not None:
            q, k = self.hook_rot_q(self.rotary(q)), self.hook_rot_k(self.rotary(k))

        path, score_readers, pattern_readers = self.choose_path(n_positions)
        self.last_path = path
        allowed = None if self.allowed is None else self.allowed[:n_positions, :n_positions]
        if path == "full":
            z = self.full_z(q, k, v)
        elif path == "sdpa":
            bias = None if self.relative_position_bias is None else self.relative_position_bias(n_positions)
            z = sdpa_z(q, k, v, self.d_head, bias, allowed)
        elif path == "associative":
            z = associative_z(q, k, v, self.d_head, allowed)
        else:
            plan = plan_blocks(self.value_network, self.n_heads, batch, n_positions, self.query_block_size,
                               score_readers, pattern_readers)
            z = blockwise_z(self.scores_to_codes(), self.value_network, plan, q, k, v,
                            self.dropout_mask(n_positions, q))
        z = self.hook_z(z)
        out = torch.addmm(
            self.b_O, z.reshape(batch * n_positions, -1), self.W_O.reshape(-1, self.W_O.shape[-1])
        )
        return out.view(batch, n_positions, -1)

    def scores_to_codes(self) -> ScoresToCodes:
        """This layer's scores -> sigma step (`latentcode.models.scores`), on its current device."""
        return ScoresToCodes(self.d_head, self.normalize, self.rms_head_eps, self.allowed, self.relative_position_bias)

    def full_z(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """z `[batch, query, head, d_head_v]` with every tensor whole: the formulas as written."""
        step = self.scores_to_codes()
        latent_codes = self.hook_pattern(step.codes(self.hook_attn_scores(step.scores(q, k))))
        latent_codes = drop_out(latent_codes, self.dropout_mask(q.shape[1], latent_codes))
        return self.value_network(latent_codes, v)

    def dropout_mask(self, n_positions: int, like: Tensor) -> Tensor | None:
        """The `[1, 1, query, key]` dropout mask of this pass (`latentcode.models.scores`) in `like`'s
        dtype, or None outside training."""
        if not (self.training and self.attn_dropout > 0):
            return None
        return dropout_mask(n_positions, n_positions, self.attn_dropout, like)

    # -- choosing a path ----------------------------------------------------------------------
    def choose_path(self, n_positions: int) -> tuple[str, tuple, tuple]:
        """`(path, score readers, pattern readers)` for a pass over `n_positions` positions: the
        `QueryBlockHook` reads that blocks must feed (see the module docstring)."""
        score_readers = block_readers(self.hook_attn_scores)
        pattern_readers = block_readers(self.hook_pattern)
        needs_whole = (
            score_readers is None or pattern_readers is None or any_hooks(self.value_network.modules())
            or global_hooks_attached()
        )
        needs_pattern = bool(score_readers or pattern_readers)
        path = self.path
        if path == "auto":
            if needs_whole or n_positions < AUTO_MIN_POSITIONS:
                return "full", (), ()
            for fast_path in ("sdpa", "associative"):
                if not needs_pattern and self.why_not(fast_path) is None:
                    return fast_path, (), ()
            return "blockwise", score_readers, pattern_readers
        if path == "full":
            return "full", (), ()
        if needs_whole:
            raise AttentionPathError(
                f"attention path {path!r} cannot run while a hook needs the whole scores, pattern or "
                "hidden tensor (only QueryBlockHooks on hook_attn_scores / hook_pattern read blocks); "
                "remove the hook or use path 'auto' or 'full'"
            )
        if path != "blockwise":
            why_not = "a QueryBlockHook reads the pattern, which it never computes" if needs_pattern else self.why_not(path)
            if why_not is not None:
                raise AttentionPathError(f"attention path {path!r} cannot compute this layer: {why_not}")
        return path, score_readers, pattern_readers

    def why_not(self, path: str) -> str | None:
        """Why `path` ("sdpa" or "associative") cannot compute this layer now, or None if it can."""
        pair = f"{self.score_normalization} + {self.value_network.config_name}"
        if self.training and self.attn_dropout > 0:
            return (
                f"it has no attention dropout of ours (one [query, key] mask), and this layer is in "
                f"training mode with attn_dropout={self.attn_dropout}; use eval mode or attn_dropout 0"
            )
        if path == "sdpa" and (self.score_normalization, self.value_network.config_name) != ("softmax", "linear"):
            return f"it needs softmax scores and the linear value network, this layer has {pair}"
        if path == "associative":
            if (self.score_normalization, self.value_network.config_name) != ("identity", "linear"):
                return f"it needs identity scores and the linear value network, this layer has {pair}"
            if self.relative_position_bias is not None:
                return "it needs positions 'rotary' or 'none', this layer has relative position bias"
        return None


def block_readers(hook_point: nn.Module) -> tuple | None:
    """The `read` functions of the `QueryBlockHook`s on `hook_point`, or None when another hook is
    there (a forward hook of another kind, a pre-hook or a backward hook): it needs the whole tensor."""
    hooks = attached_hooks(hook_point)
    if hooks.forward_pre or hooks.backward or hooks.backward_pre:
        return None
    if not all(isinstance(hook, QueryBlockHook) for hook in hooks.forward):
        return None
    return tuple(hook.read for hook in hooks.forward)


@contextmanager
def attention_path(model: nn.Module, path: str, query_block_size: int | None = None) -> Iterator[None]:
    """Compute every attention layer of `model` through `path` (one of `PATHS`) inside the block,
    with `query_block_size` queries per block (None: chosen from the sequence length); restored on
    exit. For tests and benchmarks: "auto" chooses well by itself."""
    layers = [module for module in model.modules() if isinstance(module, Attention)]
    saved = [(layer.path, layer.query_block_size) for layer in layers]
    try:
        for layer in layers:
            layer.path = path
            layer.query_block_size = query_block_size
        yield
    finally:
        for layer, (old_path, old_size) in zip(layers, saved, strict=True):
            layer.path, layer.query_block_size = old_path, old_size
