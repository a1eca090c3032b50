"""`QueryBlockHook`: a read-only hook that reads a `[batch, head, query, key]` tensor by blocks of queries.

Torch only, so that attention sources can use it without importing a model.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn


class QueryBlockHook:
    """A read-only forward hook for a `[batch, head, query, key]` hook point (`hook_attn_scores`,
    `hook_pattern`) that also reads the tensor one block of queries at a time.

    `read(tensor, query_start)`: `tensor` `[batch, head, n_block_queries, key]` holds the queries
    `query_start, query_start + 1, ...` and every key of the sequence. Registered like any forward
    hook (`hook_point.register_forward_hook(QueryBlockHook(read))`), it reads a whole tensor with
    `query_start=0`; our attention layer, which computes long sequences in blocks of queries, calls
    `read` once per block instead and so never assembles the whole tensor for it (see
    `latentcode.models.attention`). Any other hook on such a hook point needs the whole tensor.
    It never edits: a hook that returns a changed tensor is an ordinary forward hook.
    """

    def __init__(self, read: Callable[[Tensor, int], None]):
        self.read = read

    def __call__(self, module: nn.Module, inputs: tuple, output: Tensor) -> None:
        self.read(output, 0)
