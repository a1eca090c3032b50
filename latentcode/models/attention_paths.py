"""The memory-efficient ways an attention layer computes z from its queries, keys and values.

Each equals the full computation of `latentcode.models.attention` to float tolerance, in outputs
and in gradients (`latentcode.models.path_policy` chooses among them). Shapes: `q, k`
`[batch, pos, head, d_head]`, `v` `[batch, pos, head, d_head_v]` (after rotary), `z`
`[batch, query, head, d_head_v]`.

- `blockwise_z`: every variant. For one block of queries at a time: scores -> sigma -> dropout
  -> value network -> z (`latentcode.models.scores.ScoresToCodes`, shared with the full path).
  Every sigma acts within one query row or one (query, key) pair, so a block of query rows is
  computed exactly as in the full tensor; under a causal mask a block needs only the keys up to its
  last query. q and k are laid out `[batch * head, pos, d]` once (`scores.by_head`), so that a
  block's scores are one batched product of slices and its backward adds into the keys' gradient in
  place. The hyper value networks run fused C kernels where they can (`latentcode.models.fused_hyper`);
  the other value networks whose z is a sum over keys split a block's keys into tiles, so that a
  tile's hidden activations stay in cache. With gradients, `BlockwiseAttention` stores only q, k, v
  and the dropout mask and recomputes each block in the backward: the forward+backward never holds
  more than one block's tensors.
- `sdpa_z`: softmax scores with the linear value network, through `F.scaled_dot_product_attention`.
- `associative_z`: linear attention (identity sigma, linear value network, no position bias):
  z_q = q_q (sum_k k_k^T v_k), and with a causal mask the same sum chunk by chunk (quadratic inside
  a chunk, a running `[head, d_head, d_head_v]` state across chunks): O(T d^2), no T^2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from latentcode.models.scores import ScoresToCodes, by_head, drop_out, score_scale

if TYPE_CHECKING:
    from latentcode.models.value_network import ValueNetwork

BLOCK_BYTES = 2 * 2**20
"""Target size of a block's largest tensor: about a core's L2 cache on the machines we measured
(benchmarks/bench_long_sequences.py); blocks much larger spill to memory and run slower."""
FUSED_BLOCK_BYTES, FUSED_QUERY_BLOCK = 8 * 2**20, 64
"""With the fused kernels (`latentcode.models.fused_hyper`: nothing held per pair) a block holds up to
64 queries, its codes up to 8 MiB: every block passes over the keys and values before it, and blocks of
16 queries (the 2 MiB rule at T = 4096) made those passes dominate (bench_long_sequences.py)."""
MIN_QUERY_BLOCK, MAX_QUERY_BLOCK, MIN_KEY_TILE = 8, 512, 16
LINEAR_CHUNK = 64  # queries per chunk of causal linear attention

Reader = Callable[[Tensor, int], None]


@dataclass(frozen=True)
class BlockPlan:
    """How `blockwise_z` splits one forward pass.

    query_block: queries per block; key_tile: keys per tile of the value network;
    score_readers / pattern_readers: `QueryBlockHook.read`s of `hook_attn_scores` / `hook_pattern`,
    called with each block `[batch, head, block queries, every key]` and its first query.
    """

    query_block: int
    key_tile: int
    score_readers: tuple[Reader, ...] = ()
    pattern_readers: tuple[Reader, ...] = ()


def plan_blocks(value_network: ValueNetwork, n_heads: int, batch: int, n_positions: int,
                query_block: int | None = None, score_readers: Sequence[Reader] = (),
                pattern_readers: Sequence[Reader] = (), fused: bool = False) -> BlockPlan:
    """Query blocks whose latent codes `[batch, n_heads, block, n_positions]`, and key tiles whose
    per-pair activations in `value_network`, take about `BLOCK_BYTES` each (tiles about square);
    `fused`: the value network's fused kernels compute the blocks (no tiles; blocks of up to
    `FUSED_QUERY_BLOCK` queries whose codes take up to `FUSED_BLOCK_BYTES`); `query_block` (where
    given) fixes the queries per block."""
    held = value_network.floats_held_per_pair() if value_network.sums_over_keys and not fused else 0
    pairs_per_tile = max(BLOCK_BYTES // (4 * batch * held), 1) if held else 0
    if query_block is None:
        row_bytes = 4 * batch * n_heads * n_positions  # one query row of the codes
        query_block = BLOCK_BYTES // row_bytes
        if fused:
            query_block = min(FUSED_BLOCK_BYTES // row_bytes, FUSED_QUERY_BLOCK)
        if held:
            query_block = min(query_block, math.isqrt(pairs_per_tile))
        query_block = min(max(query_block, MIN_QUERY_BLOCK), MAX_QUERY_BLOCK)
    query_block = min(query_block, n_positions)
    key_tile = max(pairs_per_tile // query_block, MIN_KEY_TILE) if held else n_positions
    return BlockPlan(query_block, key_tile, tuple(score_readers), tuple(pattern_readers))


def block_codes(step: ScoresToCodes, queries_by_head: Tensor, keys_by_head: Tensor, batch: int, query_start: int,
                query_end: int, n_keys: int, score_readers: Sequence[Reader] = ()) -> Tensor:
    """Latent codes `[batch, head, block queries, n_keys]` of the queries `query_start:query_end`
    against keys `:n_keys`, from `queries_by_head` / `keys_by_head` (`by_head` of the scaled queries
    and of the keys); the score readers see the scores of every key of `keys_by_head`."""
    n_score_keys = keys_by_head.shape[1] if score_readers else n_keys
    product = step.product_block(queries_by_head, keys_by_head, batch, query_start, query_end, n_score_keys)
    scores = step.with_position_bias(product, query_start)
    for read in score_readers:
        read(scores, query_start)
    return step.codes(scores[..., :n_keys], query_start)


def block_value_network(value_network: ValueNetwork, codes: Tensor, values: Tensor, key_tile: int) -> Tensor:
    """z of one query block `[batch, block queries, head, d_head_v]` from its codes and values,
    tile by tile over keys (without gradients: the tiles' z are added in place)."""
    forward = value_network.forward_tile if value_network.has_tile_kernels else value_network
    n_keys = codes.shape[-1]
    key_tile = _key_tile(value_network, values, key_tile, n_keys)
    z = forward(codes[..., :key_tile], values[:, :key_tile])
    for key_start in range(key_tile, n_keys, key_tile):
        key_end = key_start + key_tile
        z += forward(codes[..., key_start:key_end], values[:, key_start:key_end])
    return z


def _key_tile(value_network: ValueNetwork, values: Tensor, key_tile: int, n_keys: int) -> int:
    """Keys per tile of a block: all of them where z is no sum over keys or the fused kernels compute it."""
    return n_keys if not value_network.sums_over_keys or value_network.fuses(values) else key_tile


def query_blocks(n_positions: int, plan: BlockPlan, causal: bool) -> list[tuple[int, int, int]]:
    """`(query_start, query_end, n_keys)` of each block: a causal block needs keys `< query_end`."""
    return [(start, min(start + plan.query_block, n_positions),
             min(start + plan.query_block, n_positions) if causal else n_positions)
            for start in range(0, n_positions, plan.query_block)]


def blockwise_forward(step: ScoresToCodes, value_network: ValueNetwork, plan: BlockPlan, queries_by_head: Tensor,
                      keys_by_head: Tensor, v: Tensor, keep: Tensor | None) -> Tensor:
    """z without a graph, block by block; `queries_by_head`, `keys_by_head` `[batch * head, pos, d_head]`
    (`by_head` of the scaled queries and of the keys), `keep` `[1, 1, query, key]`: the dropout mask or None."""
    batch, n_positions = v.shape[:2]
    z_blocks = []
    for query_start, query_end, n_keys in query_blocks(n_positions, plan, step.allowed is not None):
        codes = block_codes(step, queries_by_head, keys_by_head, batch, query_start, query_end, n_keys,
                            plan.score_readers)
        if plan.pattern_readers:
            # Masked keys after the block's last query have the code 0 exactly, as in the full path.
            every_key = codes if n_keys == n_positions else F.pad(codes, (0, n_positions - n_keys))
            for read in plan.pattern_readers:
                read(every_key, query_start)
        codes = drop_out(codes, None if keep is None else keep[..., query_start:query_end, :n_keys])
        z_blocks.append(block_value_network(value_network, codes, v[:, :n_keys], plan.key_tile))
    return torch.cat(z_blocks, dim=1)


def _gradients(output: Tensor, inputs: Sequence[Tensor], grad_output: Tensor) -> list[Tensor | None]:
    """d output / d input for the inputs that require grad (None for the others)."""
    wanted = [index for index, tensor in enumerate(inputs) if tensor.requires_grad]
    gradients: list[Tensor | None] = [None] * len(inputs)
    if wanted and output.requires_grad:
        found = torch.autograd.grad(output, [inputs[index] for index in wanted], grad_output.to(output.dtype),
                                    allow_unused=True)
        for index, gradient in zip(wanted, found, strict=True):
            gradients[index] = gradient
    return gradients


def _accumulate(total: list[Tensor | None], parts: Sequence[Tensor | None]) -> None:
    for index, part in enumerate(parts):
        if part is not None:
            total[index] = part if total[index] is None else total[index] + part


class BlockwiseAttention(torch.autograd.Function):
    """z = blockwise_forward(...), whose backward recomputes one query block (and one key tile) at a
    time and differentiates it at once, so that no block's tensors outlive its turn.

    apply(step, value_network, plan, q, k, v, keep, *score_parameters, *value_parameters): the
    parameters the blocks use besides q, k, v (the relative position bias table; the value
    network's own weights), so that autograd routes their gradients."""

    @staticmethod
    def forward(ctx, step, value_network, plan, q, k, v, keep, *parameters):
        ctx.step, ctx.value_network, ctx.plan = step, value_network, plan
        device_type = q.device.type
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        queries_by_head, keys_by_head = by_head(q, score_scale(step.d_head)), by_head(k)
        ctx.save_for_backward(queries_by_head, keys_by_head, v, keep)
        return blockwise_forward(step, value_network, plan, queries_by_head, keys_by_head, v, keep)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_z):
        step, value_network, plan = ctx.step, ctx.value_network, ctx.plan
        queries_by_head, keys_by_head, v, keep = ctx.saved_tensors
        batch, n_positions, n_heads = v.shape[:3]
        device_type, autocast_enabled, autocast_dtype = ctx.autocast
        score_parameters, value_parameters = block_parameters(step, value_network)
        need_q, need_k, need_v = ctx.needs_input_grad[3:6]
        # d (q / sqrt(d_head)) and d k, [batch * head, pos, d_head] like queries_by_head / keys_by_head
        grad_queries = torch.zeros_like(queries_by_head) if need_q else None
        grad_keys = torch.zeros_like(keys_by_head) if need_k else None
        grad_v = torch.zeros_like(v) if need_v else None
        grad_score_parameters: list[Tensor | None] = [None] * len(score_parameters)
        grad_value_parameters: list[Tensor | None] = [None] * len(value_parameters)

        def autocast():  # the forward's autocast, for each recomputation
            return torch.autocast(device_type, autocast_dtype, enabled=autocast_enabled)

        for query_start, query_end, n_keys in query_blocks(n_positions, plan, step.allowed is not None):
            grad_z_block = grad_z[:, query_start:query_end]
            with autocast():
                product = step.product_block(queries_by_head, keys_by_head, batch, query_start, query_end, n_keys)
            with torch.enable_grad(), autocast():
                # q . k differentiated by hand below (batched products that add into grad_keys in place)
                product = product.detach().requires_grad_(need_q or need_k)
                codes = step.codes(step.with_position_bias(product, query_start), query_start)
                codes = drop_out(codes, None if keep is None else keep[..., query_start:query_end, :n_keys])
            codes_detached = codes.detach()
            with autocast():  # the fused kernels do not run under autocast
                key_tile = _key_tile(value_network, v, plan.key_tile, n_keys)
            # d codes: the one tile's gradient where the block is one tile, else filled tile by tile
            grad_codes = torch.empty_like(codes_detached) if codes.requires_grad and key_tile < n_keys else None
            for key_start in range(0, n_keys, key_tile):
                key_end = min(key_start + key_tile, n_keys)
                if value_network.has_tile_kernels:  # written-out backward, no graph; adds to grad_v
                    with autocast():
                        tile_codes_grad, _ = value_network.backward_tile(
                            codes_detached[..., key_start:key_end], v[:, key_start:key_end], grad_z_block,
                            grad_v[:, key_start:key_end] if need_v else None)
                else:
                    with torch.enable_grad(), autocast():
                        tile_codes = codes_detached[..., key_start:key_end].detach().requires_grad_(codes.requires_grad)
                        tile_values = v[:, key_start:key_end].detach().requires_grad_(need_v)
                        z_tile = value_network(tile_codes, tile_values)
                    tile_codes_grad, tile_values_grad, *parameters_grad = _gradients(
                        z_tile, [tile_codes, tile_values, *value_parameters], grad_z_block)
                    if tile_values_grad is not None:
                        grad_v[:, key_start:key_end] += tile_values_grad
                    _accumulate(grad_value_parameters, parameters_grad)
                if codes.requires_grad:
                    if grad_codes is None:
                        grad_codes = tile_codes_grad
                    else:
                        grad_codes[..., key_start:key_end] = tile_codes_grad
            if grad_codes is not None:
                product_grad, *parameters_grad = _gradients(codes, [product, *score_parameters], grad_codes)
                _accumulate(grad_score_parameters, parameters_grad)
                if product_grad is not None:
                    product_grad = product_grad.reshape(-1, query_end - query_start, n_keys).to(queries_by_head.dtype)
                    if need_q:  # d (q / sqrt(d_head)) = d product . k
                        torch.bmm(product_grad, keys_by_head[:, :n_keys], out=grad_queries[:, query_start:query_end])
                    if need_k:  # d k += d product^T . q / sqrt(d_head)
                        grad_keys[:, :n_keys].baddbmm_(product_grad.transpose(1, 2),
                                                       queries_by_head[:, query_start:query_end])
        by_position = (batch, n_heads, n_positions, -1)
        grad_q = grad_queries.view(by_position).transpose(1, 2) * score_scale(step.d_head) if need_q else None
        grad_k = grad_keys.view(by_position).transpose(1, 2) if need_k else None
        return (None, None, None, grad_q, grad_k, grad_v, None, *grad_score_parameters, *grad_value_parameters)


def block_parameters(step: ScoresToCodes, value_network: ValueNetwork) -> tuple[list[Tensor], list[Tensor]]:
    """The parameters a block uses besides q, k, v: of the scores, and of the value network."""
    bias = step.position_bias
    return ([bias.bias_table] if bias is not None else []), list(value_network.parameters())


# torch.compile would unroll every block and tile into one graph: 9 minutes of compilation for a
# HYLA model at T=1024 and no faster step (benchmarks/bench_long_sequences.py); it runs eagerly.
@torch.compiler.disable
def blockwise_z(step: ScoresToCodes, value_network: ValueNetwork, plan: BlockPlan, q: Tensor, k: Tensor, v: Tensor,
                keep: Tensor | None) -> Tensor:
    """z computed block by block (`step`: scores -> sigma, then `value_network`, `keep`: the dropout
    mask `[1, 1, query, key]` or None); through `BlockwiseAttention` where gradients are needed."""
    score_parameters, value_parameters = block_parameters(step, value_network)
    parameters = [*score_parameters, *value_parameters]
    if torch.is_grad_enabled() and any(tensor.requires_grad for tensor in (q, k, v, *parameters)):
        return BlockwiseAttention.apply(step, value_network, plan, q, k, v, keep, *parameters)
    with torch.no_grad():
        return blockwise_forward(step, value_network, plan, by_head(q, score_scale(step.d_head)), by_head(k), v, keep)


def sdpa_z(q: Tensor, k: Tensor, v: Tensor, d_head: int, position_bias: Tensor | None = None,
           allowed: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(d_head) + position_bias, masked) v through `F.scaled_dot_product_attention`;
    `position_bias` `[head, query, key]` or None, `allowed` the causal mask `[query, key]` or None.
    Without dropout (the layer's dropout is one [query, key] mask shared by batch and heads, which
    SDPA's own dropout is not)."""
    causal = allowed is not None
    bias = position_bias
    if bias is not None:
        if causal:
            bias = bias.masked_fill(~allowed, float("-inf"))
        bias = bias.to(q.dtype)
    z = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias,
                                       is_causal=causal and bias is None, scale=score_scale(d_head))
    return z.transpose(1, 2)


def associative_z(q: Tensor, k: Tensor, v: Tensor, d_head: int, allowed: Tensor | None = None,
                  chunk: int | None = None) -> Tensor:
    """z[q] = sum_k (q_q . k_k / sqrt(d_head)) v_k (keys k <= q when causal: `allowed`, the causal mask
    `[query, key]`, is not None) without the [query, key] scores of the whole sequence; `chunk`
    queries per chunk when causal (None: `LINEAR_CHUNK`)."""
    chunk = LINEAR_CHUNK if chunk is None else chunk
    # [batch, head, pos, d] once, so that every product below reads slices of it without copies.
    q = (q * score_scale(d_head)).transpose(1, 2).contiguous()
    k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    if allowed is None:
        return torch.matmul(q, torch.matmul(k.transpose(-1, -2), v)).transpose(1, 2)
    n_positions = q.shape[2]
    z_chunks, state = [], None  # state: sum over earlier chunks of k^T v, [batch, head, d_head, d_head_v]
    for start in range(0, n_positions, chunk):
        end = min(start + chunk, n_positions)
        q_chunk, k_chunk, v_chunk = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        scores = torch.matmul(q_chunk, k_chunk.transpose(-1, -2))
        scores = scores.masked_fill(~allowed[: end - start, : end - start], 0.0)
        z_chunk = torch.matmul(scores, v_chunk)
        if state is not None:
            z_chunk = z_chunk + torch.matmul(q_chunk, state)
        z_chunks.append(z_chunk)
        chunk_state = torch.matmul(k_chunk.transpose(-1, -2), v_chunk)
        state = chunk_state if state is None else state + chunk_state
    return torch.cat(z_chunks, dim=2).transpose(1, 2)
