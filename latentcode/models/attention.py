"""Multi-head attention as a score normalization sigma composed with a value network.

    q, k, v        = x W_Q + b_Q, x W_K + b_K, x W_V + b_V        [batch, pos, head, d_head(_v)]
    scores[h,q,k]  = q[q,h] . k[k,h] / sqrt(d_head) + position_bias[h,q,k]
    a              = sigma(scores)                                 the latent codes, hook_pattern
    z              = value_network(a, v)                           [batch, query, head, d_head_v]
    out[q]         = sum_h z[q,h] W_O[h] + b_O

sigma (`latentcode.models.normalization`): softmax over keys, rms over heads (HYLA), the identity
(linear attention), or softmax then rms; the value networks: `latentcode.models.value_network`.

Parameters carry TransformerLens's names and shapes (`W_Q` `[n_heads, d_model, d_head]`, ...: `__init__`).

The scores, sigma and dropout are written once, in `latentcode.models.scores`, for every path.
Attention dropout (training mode only) multiplies the latent codes after `hook_pattern`, so
recorded codes are never dropped out; as in the authors' configuration (Flax's
`broadcast_dropout=True`), one mask `[query, key]` is shared by all batch elements and heads.

Paths. `forward` writes the formulas above (the full path); `latentcode.models.path_policy` says
which faster path (blockwise, sdpa, associative: `latentcode.models.attention_paths`; fused:
`latentcode.models.fused_short`) computes the same z when, and which hooks force the full path.
`Attention.path` (default "auto") or the context manager `attention_path(model, path)` forces one;
`query_block_size` (None: chosen so that a block's codes take about 2 MiB) sets the queries per block.

What each hook costs: on hook_q, hook_k, hook_v, hook_rot_q, hook_rot_k, hook_z nothing (whole
`[batch, pos, ...]` tensors in every path). On hook_attn_scores and hook_pattern a `QueryBlockHook`
(read only; the Recorder's site recording uses it) costs nothing: it reads each block `[batch, head,
block, key]` with its first query (a causal block pads its masked keys: codes 0; a reader of the
scores makes each block also score its masked keys). Any other hook there (TransformerLens hooks,
run_with_cache, interventions that edit codes, backward hooks), or any hook on the value network
(hook_hidden, hook_hidden2), takes the full path: T^2 floats per batch element and head (T^2 d_head_v
for the hidden activations), forward and backward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from latentcode.errors import LatentcodeError
from latentcode.models.attention_paths import associative_z, blockwise_z, plan_blocks, sdpa_z
from latentcode.models.config import ModelConfig
from latentcode.models.feedforward import affine
from latentcode.models.fused_short import short_attention
from latentcode.models.hooks import HookPoint
from latentcode.models.initializers import lecun_normal_
from latentcode.models.normalization import SCORE_NORMALIZATIONS
from latentcode.models.path_policy import PATHS, AttentionPathError, PathChoice, choose_path
from latentcode.models.positions import RelativePositionBias, Rotary
from latentcode.models.scores import ScoresToCodes, drop_out, dropout_mask, score_scale
from latentcode.models.value_network import VALUE_NETWORKS


class InputShapeError(LatentcodeError, ValueError):
    """An input that does not match the model; the message names the expected and received shape."""


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
        self.W_O = nn.Parameter(lecun_normal_(torch.empty(self.n_heads, self.d_head_v, d_model),
                                              self.n_heads * self.d_head_v))
        self.b_Q = nn.Parameter(torch.zeros(self.n_heads, self.d_head))
        self.b_K = nn.Parameter(torch.zeros(self.n_heads, self.d_head))
        self.b_V = nn.Parameter(torch.zeros(self.n_heads, self.d_head_v))
        self.b_O = nn.Parameter(torch.zeros(d_model))

        self.score_normalization = config.score_normalization
        self.normalization = SCORE_NORMALIZATIONS[self.score_normalization]  # sigma
        self.value_network = VALUE_NETWORKS[config.value_network](self.n_heads, self.d_head_v)
        self.attn_dropout = config.attn_dropout
        self.rms_head_eps = config.rms_head_eps

        relative, rotary = config.positions == "relative", config.positions == "rotary"
        self.relative_position_bias = RelativePositionBias(self.n_heads, config.n_ctx) if relative else None
        self.rotary = Rotary(self.d_head, config.n_ctx, config.rotary_base) if rotary else None
        allowed = torch.ones(config.n_ctx, config.n_ctx, dtype=torch.bool).tril() if config.causal else None
        self.register_buffer("allowed", allowed, persistent=False)  # the keys each query may see, or None

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

    def forward(self, x: Tensor) -> Tensor:
        """x: the attention input `[batch, pos, d_model]` -> attention output `[batch, pos, d_model]`."""
        self.check_length(x)
        q, k, v = self.queries_keys_values(x)  # [batch, pos, head, d_head(_v)]
        choice = choose_path(self, x.shape[1])  # latentcode.models.path_policy
        self.last_path = choice.path
        if choice.path == "full":
            step = self.scores_to_codes()
            scores = self.hook_attn_scores(step.scores(q, k))  # [batch, head, query, key]
            latent_codes = self.hook_pattern(step.codes(scores))  # a = sigma(scores)
            keep = self.dropout_mask(latent_codes.shape[-1], latent_codes)
            z = self.value_network(drop_out(latent_codes, keep), v)  # [batch, query, head, d_head_v]
        else:  # the same z, never holding the whole [batch, head, query, key] tensors
            z = self.z_by_faster_path(choice, q, k, v)
        return self.project_out(self.hook_z(z))

    # -- the steps of forward ------------------------------------------------------------------
    def check_length(self, x: Tensor) -> None:
        """Refuse an input `[batch, pos, d_model]` with more than n_ctx positions, in one line."""
        if x.shape[1] > self.config.n_ctx:
            raise InputShapeError(
                f"attention input has {x.shape[1]} positions but the layer accepts at most "
                f"n_ctx={self.config.n_ctx} (shape {list(x.shape)}); build the model with a larger n_ctx"
            )

    def queries_keys_values(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v `[batch, pos, head, d]` of the attention input `[batch, pos, d_model]` through their hooks,
        q and k rotated where positions are rotary. One matrix product for all three (the weights are
        concatenated on the fly, a small copy)."""
        batch, n_positions, d_model = x.shape
        weight = torch.cat([w.permute(1, 0, 2).reshape(d_model, -1) for w in (self.W_Q, self.W_K, self.W_V)], dim=1)
        bias = torch.cat([self.b_Q.reshape(-1), self.b_K.reshape(-1), self.b_V.reshape(-1)])
        h = self.n_heads
        q, k, v = affine(x, weight, bias).split([h * self.d_head, h * self.d_head, h * self.d_head_v], dim=-1)
        q, k, v = (part.view(batch, n_positions, h, -1) for part in (q, k, v))
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if self.rotary is not None:
            q, k = self.hook_rot_q(self.rotary(q)), self.hook_rot_k(self.rotary(k))
        return q, k, v

    def project_out(self, z: Tensor) -> Tensor:
        """out[q] = sum_h z[q, h] W_O[h] + b_O `[batch, pos, d_model]` from z `[batch, pos, head, d_head_v]`."""
        return affine(z.flatten(2), self.W_O.reshape(-1, self.W_O.shape[-1]), self.b_O)

    def z_by_faster_path(self, choice: PathChoice, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """z `[batch, query, head, d_head_v]` through the blockwise, sdpa or associative path
        (`latentcode.models.attention_paths`) or the fused one (`latentcode.models.fused_short`),
        whichever `choice` names."""
        batch, n_positions = q.shape[:2]
        allowed = None if self.allowed is None else self.allowed[:n_positions, :n_positions]
        if choice.path == "sdpa":
            bias = None if self.relative_position_bias is None else self.relative_position_bias(n_positions)
            return sdpa_z(q, k, v, self.d_head, bias, allowed)
        if choice.path == "associative":
            return associative_z(q, k, v, self.d_head, allowed)
        if choice.path == "fused":
            bias = None if self.relative_position_bias is None else self.relative_position_bias(n_positions)
            return short_attention(
                q * score_scale(self.d_head), k, v, bias, allowed, self.dropout_mask(n_positions, q),
                self.normalization.fused_code, self.value_network.fused_code, self.rms_head_eps)
        plan = plan_blocks(self.value_network, self.n_heads, batch, n_positions, self.query_block_size,
                           choice.score_readers, choice.pattern_readers, fused=self.value_network.fuses(v))
        return blockwise_z(self.scores_to_codes(), self.value_network, plan, q, k, v, self.dropout_mask(n_positions, q))

    def scores_to_codes(self) -> ScoresToCodes:
        """This layer's scores -> sigma step (`latentcode.models.scores`), on its current device."""
        return ScoresToCodes(self.d_head, self.normalization, self.rms_head_eps, self.allowed,
                             self.relative_position_bias)

    def dropout_mask(self, n_positions: int, like: Tensor) -> Tensor | None:
        """The `[1, 1, query, key]` dropout mask of this pass (`latentcode.models.scores`) in `like`'s
        dtype, or None outside training."""
        if not (self.training and self.attn_dropout > 0):
            return None
        return dropout_mask(n_positions, n_positions, self.attn_dropout, like)

    # -- the path ------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """How z is computed: one of `PATHS` (`latentcode.models.path_policy`); "auto" chooses."""
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
            raise AttentionPathError(f"query_block_size must be a positive integer (queries per block) or None (chosen "
                                     f"from the sequence length), got {size!r}")
        self._query_block_size = size


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
