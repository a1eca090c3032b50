"""The hypernetwork view of attention: the latent code a[:, q, k] configures a value network.

For one layer and one key-query pair (q, k), attention applies to the key's input x_k a network
whose weights are linear in the latent code (column-vector convention, W_h^value = W_V[h]^T
`[d_head_v, d_model]`, W_h^out = W_O[h]^T `[d_model, d_head_v]`):

- linear value network (softmax / linear attention):
      W_{q,k} = sum_h a[h,q,k] W_h^out W_h^value               one layer [d_model, d_model]
      bias_{q,k} = sum_h a[h,q,k] W_h^out b_h^value
- hyper_linear / hyper_relu (HYLA) / hyper_deep:
      first layer   sum_h a[h,q,k] W_h^value  [d_head_v, d_model], bias sum_h a[h,q,k] b_h^value
      (hyper_deep)  sum_h a[h,q,k] W_h^value2^T  [d_head_v, d_head_v]
      last layer    sum_h a[h,q,k] W_h^out    [d_model, d_head_v]
  with relu between layers (none for hyper_linear).

Then the layer's output is exactly y_q = sum_k network_{q,k}(x_k) + b^out. `relu_linear` applies
its nonlinearity after the sum over keys, so it has no per-pair network and no exact view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from latentcode.models.transformer import Transformer

EXACT_VALUE_NETWORKS = ("linear", "hyper_linear", "hyper_relu", "hyper_deep")


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
        raise ValueError(f"{what} selection is empty")
    bad = positions[(positions < -n_positions) | (positions >= n_positions)]
    if bad.numel():
        raise IndexError(
            f"{what} positions {bad.tolist()} are outside the sequence of {n_positions} positions "
            f"(valid: -{n_positions}..{n_positions - 1})"
        )
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
    The generated weights take `batch x n_queries x n_keys x (weights per pair)` floats; a
    selection above `max_bytes` is refused with the size it would need. The model runs in eval
    mode (no attention dropout) and is restored to its previous mode.
    """
    n_layers = model.config.n_layers
    if not -n_layers <= layer < n_layers:
        raise IndexError(f"layer {layer} is outside the model's {n_layers} layers (0..{n_layers - 1})")
    layer %= n_layers
    attention = model.blocks[layer].attn
    value_network = model.config.value_network
    if value_network not in EXACT_VALUE_NETWORKS:
        raise ValueError(
            f"the {value_network!r} value network has no key-query specific network: it applies its "
            f"nonlinearity after summing over keys. Exact views exist for {EXACT_VALUE_NETWORKS}."
        )

    model.check_input(tokens)
    n_positions = tokens.shape[1]
    query_index = _positions(queries, n_positions, "query")
    key_index = _positions(keys, n_positions, "key")

    sizes = model.config.sizes
    d_model, d_head_v = sizes.d_model, sizes.d_head_v
    pairs = tokens.shape[0] * len(query_index) * len(key_index)
    if value_network == "linear":
        floats_per_pair = d_model * d_model + d_model
    else:
        floats_per_pair = 2 * d_head_v * d_model + d_head_v + (d_head_v**2 if value_network == "hyper_deep" else 0)
    needed = pairs * floats_per_pair * attention.W_O.element_size()
    if needed > max_bytes:
        raise MemoryError(
            f"the generated weights of {pairs} (batch x query x key) pairs need {needed / 2**30:.2f} GiB, "
            f"above max_bytes={max_bytes / 2**30:.2f} GiB; select fewer queries/keys or a smaller batch"
        )

    was_training = model.training
    model.eval()
    try:
        names = (f"blocks.{layer}.ln1.hook_normalized", f"blocks.{layer}.attn.hook_pattern")
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    finally:
        model.train(was_training)
    attention_input, pattern = cache[names[0]], cache[names[1]]
    codes = pattern[:, :, query_index][:, :, :, key_index]  # [batch, head, n_queries, n_keys]

    value_weight = attention.W_V.transpose(1, 2)  # W_h^value [head, d_head_v, d_model]
    out_weight = attention.W_O.transpose(1, 2)  # W_h^out [head, d_model, d_head_v]
    first_bias = torch.einsum("bhqk,hd->bqkd", codes, attention.b_V)

    if value_network == "linear":
        per_head = out_weight @ value_weight  # W_h^out W_h^value [head, d_model, d_model]
        weights = [torch.einsum("bhqk,hoi->bqkoi", codes, per_head)]
        per_head_bias = torch.einsum("hod,hd->ho", out_weight, attention.b_V)
        biases: list[Tensor | None] = [torch.einsum("bhqk,ho->bqko", codes, per_head_bias)]
        activations: list[str] = []
    else:
        activation = "identity" if value_network == "hyper_linear" else "relu"
        weights = [torch.einsum("bhqk,hoi->bqkoi", codes, value_weight)]
        biases = [first_bias]
        activations = [activation]
        if value_network == "hyper_deep":
            second = attention.value_network.W_value2.transpose(1, 2)  # [head, d_out, d_in]
            weights.append(torch.einsum("bhqk,hoi->bqkoi", codes, second))
            biases.append(None)
            activations.append("relu")
        weights.append(torch.einsum("bhqk,hoi->bqkoi", codes, out_weight))
        biases.append(None)

    return GeneratedValueNetwork(
        value_network=value_network,
        layer=layer,
        queries=query_index,
        keys=key_index,
        latent_codes=codes,
        weights=weights,
        biases=biases,
        activations=activations,
        key_inputs=attention_input[:, key_index],
        output_bias=attention.b_O.detach().clone(),
    )
