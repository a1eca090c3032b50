"""The hypernetwork view of attention: the latent code a[:, q, k] configures a value network.

For one layer and one key-query pair (q, k), attention applies to the key's input x_k a network
whose weights are linear in the latent code (`latentcode.models.value_network` writes each value
network's layers), so that the layer's output is exactly y_q = sum_k network_{q,k}(x_k) + b^out.
`relu_linear` applies its nonlinearity after the sum over keys: it has no per-pair network and no
exact view. This module selects the pairs, runs the model and bounds the memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from latentcode.errors import LatentcodeError
from latentcode.models.transformer import Transformer


class ViewSelectionError(LatentcodeError, IndexError):
    """A layer, query or key selection outside the model or the sequence."""


class ViewTooLarge(LatentcodeError, ValueError):
    """The generated weights of the selected pairs would take more memory than `max_bytes`."""


@dataclass
class GeneratedValueNetwork:
    """The key-query specific value networks of one layer, for the selected (query, key) pairs.

    latent_codes: `[batch, head, n_queries, n_keys]`, a[:, q, k] for the selected pairs.
    weights[i]: `[batch, n_queries, n_keys, d_out_i, d_in_i]`, layer i of each pair's network
        (column-vector convention: layer i maps h to weights[i] @ h + biases[i]).
    biases[i]: `[batch, n_queries, n_keys, d_out_i]` or None.
    activations[i]: applied after layer i, for all but the last layer ("relu" or "identity").
    key_inputs: `[batch, n_keys, d_model]`, the attention's input x_k at the selected keys.
    output_bias: `[d_model]`, b^out, added once per query.
    """

    value_network: str
    layer: int
    queries: Tensor
    keys: Tensor
    latent_codes: Tensor
    weights: list[Tensor]
    biases: list[Tensor | None]
    activations: list[str]
    key_inputs: Tensor
    output_bias: Tensor

    def apply(self) -> Tensor:
        """Each pair's network applied to its key input: `[batch, n_queries, n_keys, d_model]`."""
        hidden = self.key_inputs[:, None, :, :]  # [batch, 1, n_keys, d_model]
        for index, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            hidden = torch.einsum("bqkoi,bqki->bqko", weight, hidden.expand(*weight.shape[:3], -1))
            if bias is not None:
                hidden = hidden + bias
            if index < len(self.activations) and self.activations[index] == "relu":
                hidden = torch.relu(hidden)
        return hidden

    def output(self) -> Tensor:
        """sum_k network_{q,k}(x_k) + b^out `[batch, n_queries, d_model]`: the attention output
        at the selected queries when all keys are selected."""
        return self.apply().sum(dim=2) + self.output_bias


def _positions(selection: Sequence[int] | Tensor | None, n_positions: int, what: str) -> Tensor:
    if selection is None:
        return torch.arange(n_positions)
    positions = torch.as_tensor(selection, dtype=torch.long).reshape(-1)
    if positions.numel() == 0:
        raise ViewSelectionError(f"{what} selection is empty")
    bad = positions[(positions < -n_positions) | (positions >= n_positions)]
    if bad.numel():
        raise ViewSelectionError(f"{what} positions {bad.tolist()} are outside the sequence of {n_positions} positions "
                                 f"(valid: -{n_positions}..{n_positions - 1})")
    return positions % n_positions


@torch.no_grad()
def value_network_view(
    model: Transformer,
    tokens: Tensor,
    layer: int,
    queries: Sequence[int] | Tensor | None = None,
    keys: Sequence[int] | Tensor | None = None,
    max_bytes: int = 2**31,
) -> GeneratedValueNetwork:
    """Latent codes and generated value-network weights of `layer` for the input `tokens`.

    queries / keys: positions to build networks for (default all; negative counts from the end).
    The generated weights take `batch x n_queries x n_keys x (floats per pair)` floats; a
    selection above `max_bytes` is refused (`ViewTooLarge`) with the size it would need. A model
    whose value network has no per-pair network (relu_linear) is refused (`NoExactView`). The
    model runs in eval mode (no attention dropout) and is restored to its previous mode.
    """
    n_layers = model.config.n_layers
    if not -n_layers <= layer < n_layers:
        raise ViewSelectionError(f"layer {layer} is outside the model's {n_layers} layers (0..{n_layers - 1})")
    layer %= n_layers
    attention = model.blocks[layer].attn
    value_network = attention.value_network
    floats_per_pair = value_network.floats_per_pair(model.config.sizes.d_model)

    model.check_input(tokens)
    n_positions = tokens.shape[1]
    query_index = _positions(queries, n_positions, "query")
    key_index = _positions(keys, n_positions, "key")

    pairs = tokens.shape[0] * len(query_index) * len(key_index)
    needed = pairs * floats_per_pair * attention.W_O.element_size()
    if needed > max_bytes:
        raise ViewTooLarge(f"the generated weights of {pairs} (batch x query x key) pairs need "
                           f"{needed / 2**30:.2f} GiB ({needed} bytes), above max_bytes={max_bytes / 2**30:.2f} GiB "
                           f"({max_bytes} bytes); select fewer queries/keys or a smaller batch, or raise max_bytes")

    was_training = model.training
    model.eval()
    try:
        names = (f"blocks.{layer}.ln1.hook_normalized", f"blocks.{layer}.attn.hook_pattern")
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    finally:
        model.train(was_training)
    attention_input, pattern = cache[names[0]], cache[names[1]]
    codes = pattern[:, :, query_index][:, :, :, key_index]  # [batch, head, n_queries, n_keys]
    weights, biases, activations = value_network.generated_layers(codes, attention.W_V, attention.b_V, attention.W_O)
    return GeneratedValueNetwork(value_network.config_name, layer, query_index, key_index, codes, weights, biases,
                                 activations, key_inputs=attention_input[:, key_index],
                                 output_bias=attention.b_O.detach().clone())
