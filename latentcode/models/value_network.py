"""Value networks: how the latent codes `a[h, q, k]` combine the per-head values into `z`.

Every value network maps latent codes `a` `[batch, head, query, key]` and per-head values
`v[b, k, h] = W_h^value x_k + b_h^value` `[batch, key, head, d_head_v]` to
`z` `[batch, query, head, d_head_v]`; the attention layer then applies the output projection,
`y_q = sum_h W_h^out z[q, h] + b^out`. For one query q, `linear` (standard attention) gives
y_q = sum_h W_h^out sum_k a[h,q,k] W_h^value x_k, and `hyper_relu` (HYLA)
y_q = sum_k (sum_h a[h,q,k] W_h^out) relu(sum_h a[h,q,k] W_h^value x_k); each class writes its own.

The hyper variants are two-layer (or three-layer) networks per key-query pair whose weights the
latent code generates. Their hidden activation `[batch, query, key, d_head_v]` passes through
`hook_hidden` (and `hook_hidden2` for hyper_deep).

Each value network is one class (`VALUE_NETWORKS`, the one table of names) that declares, as class
attributes, what the attention layer's paths need to know of it, and gives the network it applies to
each pair for the hypernetwork view (`generated_layers`, `floats_per_pair`).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
from einops import einsum, rearrange
from torch import Tensor, nn

from latentcode.errors import LatentcodeError
from latentcode.models import fused_hyper, fused_short
from latentcode.models.hooks import HookPoint
from latentcode.models.initializers import truncated_normal_std_


class NoExactView(LatentcodeError, ValueError):
    """The value network has no key-query specific network, so no hypernetwork view exists."""


class GeneratedLayers(NamedTuple):
    """The layers of each selected pair's network, in the column-vector convention.

    weights[i]: `[batch, query, key, d_out_i, d_in_i]`; biases[i]: `[batch, query, key, d_out_i]`
    or None; activations[i] ("relu" or "identity") follows layer i, for all but the last layer.
    """

    weights: list[Tensor]
    biases: list[Tensor | None]
    activations: list[str]


def _generate(latent_codes: Tensor, per_head: Tensor) -> Tensor:
    """sum_h a[b, h, q, k] per_head[h]: one tensor per pair, `[batch, query, key, ...]`."""
    return torch.einsum("bhqk,h...->bqk...", latent_codes, per_head)


class ValueNetwork(nn.Module):
    """Base of the value networks: `forward(latent_codes, values) -> z` (module docstring).

    A subclass sets `config_name` and writes `forward`; `generated_layers` and `floats_per_pair`
    describe the network that a latent code a[:, q, k] generates, for the hypernetwork view.
    """

    # The name ModelConfig uses. Not `name`: HookedRootModule.setup() sets each module's `name` to its path.
    config_name: ClassVar[str]
    # z[q, h] = sum_k a[h, q, k] v[k, h] and nothing more (standard attention): fused attention
    # kernels and linear attention's reassociation compute it (`latentcode.models.path_policy`).
    is_weighted_sum_of_values: ClassVar[bool] = False
    # z[q] = sum_k f(a[:, q, k], v[k]): the keys may be processed in tiles whose z are added.
    sums_over_keys: ClassVar[bool] = True
    # forward_tile / backward_tile exist: the blockwise path's hand-written kernels (no autograd).
    has_tile_kernels: ClassVar[bool] = False
    # How `latentcode.models.fused_short`'s kernel computes it (training on short sequences), or None.
    fused_code: ClassVar[int | None] = None

    def __init__(self, n_heads: int, d_head_v: int):
        super().__init__()
        self.n_heads, self.d_head_v = n_heads, d_head_v

    def forward(self, latent_codes: Tensor, values: Tensor) -> Tensor:
        raise NotImplementedError

    def generated_layers(self, latent_codes: Tensor, W_V: Tensor, b_V: Tensor, W_O: Tensor) -> GeneratedLayers:
        """The network of each pair, from latent codes `[batch, head, query, key]` and the attention
        layer's `W_V` `[head, d_model, d_head_v]`, `b_V` `[head, d_head_v]`, `W_O`
        `[head, d_head_v, d_model]` (TransformerLens's shapes)."""
        raise NotImplementedError

    def floats_per_pair(self, d_model: int) -> int:
        """How many floats `generated_layers` returns for one (batch, query, key) pair."""
        raise NotImplementedError

    def floats_held_per_pair(self) -> int:
        """Floats the forward materializes per (batch, query, key) pair besides the latent code
        (0: none; the attention layer sizes its key tiles with it)."""
        return 0

    def fuses(self, values: Tensor) -> bool:
        """Whether `forward_tile` / `backward_tile` compute tiles of these values (and latent codes of
        their dtype) without materializing any per-pair activation (then a block needs no key tiles)."""
        return False


class LinearValueNetwork(ValueNetwork):
    """Standard attention: z[b, q, h] = sum_k a[b, h, q, k] v[b, k, h].

    Per pair it is one generated layer, W_{q,k} = sum_h a[h,q,k] W_h^out W_h^value
    `[d_model, d_model]` with bias sum_h a[h,q,k] W_h^out b_h^value.
    """

    config_name = "linear"
    is_weighted_sum_of_values = True
    fused_code = fused_short.LINEAR

    def forward(self, latent_codes: Tensor, values: Tensor) -> Tensor:
        return torch.einsum("bhqk,bkhd->bqhd", latent_codes, values)

    def generated_layers(self, latent_codes: Tensor, W_V: Tensor, b_V: Tensor, W_O: Tensor) -> GeneratedLayers:
        # W_h^out W_h^value
        out_times_value = einsum(W_O, W_V, "head d_head_v d_out, head d_in d_head_v -> head d_out d_in")
        out_times_bias = einsum(W_O, b_V, "head d_head_v d_out, head d_head_v -> head d_out")
        return GeneratedLayers(weights=[_generate(latent_codes, out_times_value)],
                               biases=[_generate(latent_codes, out_times_bias)],
                               activations=[])

    def floats_per_pair(self, d_model: int) -> int:
        return d_model * d_model + d_model


class ReluLinearValueNetwork(ValueNetwork):
    """z[b, q, h] = relu(sum_k a[b, h, q, k] v[b, k, h]): the nonlinearity comes after the key sum,
    so the layer is not a sum over keys of per-pair networks and has no hypernetwork view."""

    config_name = "relu_linear"
    sums_over_keys = False  # the ReLU comes after the sum over keys

    def forward(self, latent_codes: Tensor, values: Tensor) -> Tensor:
        return torch.relu(torch.einsum("bhqk,bkhd->bqhd", latent_codes, values))

    def _refuse(self) -> NoExactView:
        others = ", ".join(name for name in VALUE_NETWORKS if name != self.config_name)
        return NoExactView(f"the {self.config_name!r} value network has no key-query specific network: it applies "
                           f"its nonlinearity after summing over keys; a hypernetwork view needs a value network "
                           f"that acts per key-query pair ({others})")

    def generated_layers(self, latent_codes: Tensor, W_V: Tensor, b_V: Tensor, W_O: Tensor) -> GeneratedLayers:
        raise self._refuse()

    def floats_per_pair(self, d_model: int) -> int:
        raise self._refuse()


class HyperValueNetwork(ValueNetwork):
    """Key-query specific networks generated by the latent code (the `hyper_*` value networks).

    hidden[b, q, k] = act(sum_h a[b, h, q, k] v[b, k, h])               first generated layer
    (hyper_deep)    = relu(sum_h a[b, h, q, k] W_value2[h]^T hidden)     second generated layer
    z[b, q, h]      = sum_k a[b, h, q, k] hidden[b, q, k]               so that W_O gives
    y_q             = sum_k (sum_h a[h, q, k] W_h^out) hidden[q, k]

    Per pair: first layer sum_h a[h,q,k] W_h^value `[d_head_v, d_model]` with bias
    sum_h a[h,q,k] b_h^value, (hyper_deep) sum_h a[h,q,k] W_value2[h]^T `[d_head_v, d_head_v]`,
    last layer sum_h a[h,q,k] W_h^out `[d_model, d_head_v]`.
    """

    activation: ClassVar[str]  # after the first generated layer: "relu" or "identity"

    def __init__(self, n_heads: int, d_head_v: int):
        super().__init__(n_heads, d_head_v)
        self.hook_hidden = HookPoint()  # [batch, query, key, d_head_v]

    def first_layer(self, latent_codes: Tensor, values: Tensor) -> Tensor:
        """act(sum_h a[b, h, q, k] v[b, k, h]) `[batch, query, key, d_head_v]`, via hook_hidden."""
        hidden = torch.einsum("bhqk,bkhd->bqkd", latent_codes, values)
        if self.activation == "relu":
            hidden = torch.relu(hidden)
        return self.hook_hidden(hidden)

    def last_layer(self, latent_codes: Tensor, hidden: Tensor) -> Tensor:
        """z[b, q, h] = sum_k a[b, h, q, k] hidden[b, q, k]; W_O then sums over heads."""
        return torch.einsum("bhqk,bqkd->bqhd", latent_codes, hidden)

    def forward(self, latent_codes: Tensor, values: Tensor) -> Tensor:
        return self.last_layer(latent_codes, self.first_layer(latent_codes, values))

    def generated_layers(self, latent_codes: Tensor, W_V: Tensor, b_V: Tensor, W_O: Tensor) -> GeneratedLayers:
        value_weight = rearrange(W_V, "head d_model d_head_v -> head d_head_v d_model")
        out_weight = rearrange(W_O, "head d_head_v d_model -> head d_model d_head_v")
        return GeneratedLayers(weights=[_generate(latent_codes, value_weight), _generate(latent_codes, out_weight)],
                               biases=[_generate(latent_codes, b_V), None],
                               activations=[self.activation])

    def floats_per_pair(self, d_model: int) -> int:
        return 2 * self.d_head_v * d_model + self.d_head_v

    def floats_held_per_pair(self) -> int:
        return self.d_head_v  # the hidden activation (its gradient takes its place in the backward)

    # -- the blockwise path's kernels for one tile of keys ------------------------------------------
    # forward() through einsum is slow for these shapes (it sums over the short head axis). The fused C
    # kernels (`fused_hyper`) never form the hidden activation; where they cannot run, the batched products
    # below keep it as [batch, key, query, d_head_v] (plain batched matrix products) and write the backward
    # out. Both equal forward() and its autograd gradients to float tolerance.
    has_tile_kernels = True

    def fuses(self, values: Tensor) -> bool:
        return fused_hyper.available(values)

    def _tile_hidden(self, latent_codes: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """`(codes [batch, key, query, head], hidden [batch, key, query, d_head_v])` of a tile."""
        codes_by_key = latent_codes.permute(0, 3, 2, 1).contiguous()
        hidden = torch.matmul(codes_by_key, values)  # sum_h a[b, h, q, k] v[b, k, h]
        if self.activation == "relu":
            hidden = hidden.relu_()
        return codes_by_key, hidden

    def forward_tile(self, latent_codes: Tensor, values: Tensor) -> Tensor:
        """forward(latent_codes, values) of a tile of keys, without hooks and without a graph."""
        if self.fuses(values) and latent_codes.dtype == values.dtype:
            return fused_hyper.forward(latent_codes, values, relu=self.activation == "relu")
        _, hidden = self._tile_hidden(latent_codes, values)
        # z[b, q, h] = sum_k a[b, h, q, k] hidden[b, k, q], one batched product per batch element.
        return torch.stack([
            torch.bmm(codes.transpose(0, 1), element_hidden.transpose(0, 1))
            for codes, element_hidden in zip(latent_codes, hidden, strict=True)
        ])

    def backward_tile(self, latent_codes: Tensor, values: Tensor, grad_z: Tensor,
                      grad_values: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Gradients `(d latent_codes [batch, head, query, key], d values [batch, key, head, d_head_v])`
        of `sum(forward(latent_codes, values) * grad_z)` for a tile, recomputing its hidden activation;
        where `grad_values` is given, d values is added to it (and it is returned)."""
        if self.fuses(values) and latent_codes.dtype == values.dtype:
            grad_codes, tile_grad_values = fused_hyper.backward(latent_codes, values, grad_z, self.activation == "relu")
        else:
            grad_codes, tile_grad_values = self._backward_by_products(latent_codes, values, grad_z)
        if grad_values is None:
            return grad_codes, tile_grad_values
        grad_values += tile_grad_values
        return grad_codes, grad_values

    def _backward_by_products(self, latent_codes: Tensor, values: Tensor, grad_z: Tensor) -> tuple[Tensor, Tensor]:
        codes_by_key, hidden = self._tile_hidden(latent_codes, values)
        grad_codes = latent_codes.new_empty(latent_codes.shape)
        tile_grad_values = values.new_empty(values.shape)
        for index in range(latent_codes.shape[0]):
            codes, element_hidden, element_grad_z = latent_codes[index], hidden[index], grad_z[index]
            # d hidden[k, q] = sum_h a[h, q, k] dz[q, h]: [key, query, d_head_v]
            grad_hidden = torch.bmm(codes.permute(1, 2, 0), element_grad_z).transpose(0, 1)
            if self.activation == "relu":
                grad_hidden = torch.ops.aten.threshold_backward(grad_hidden, element_hidden, 0)
            # d a[h, q, k] = dz[q, h] . hidden[k, q]  +  d hidden[k, q] . v[k, h]
            through_last = torch.bmm(element_grad_z, element_hidden.permute(1, 2, 0))  # [query, head, key]
            through_first = torch.bmm(grad_hidden, values[index].transpose(1, 2))  # [key, query, head]
            grad_codes[index] = through_last.permute(1, 0, 2) + through_first.permute(2, 1, 0)
            # d v[k, h] = sum_q a[h, q, k] d hidden[k, q]
            tile_grad_values[index] = torch.bmm(codes_by_key[index].transpose(1, 2), grad_hidden)
        return grad_codes, tile_grad_values


class HyperLinearValueNetwork(HyperValueNetwork):
    config_name = "hyper_linear"
    activation = "identity"
    fused_code = fused_short.HYPER_LINEAR


class HyperReluValueNetwork(HyperValueNetwork):
    """HYLA's value network."""

    config_name = "hyper_relu"
    activation = "relu"
    fused_code = fused_short.HYPER_RELU


class HyperDeepValueNetwork(HyperValueNetwork):
    """hyper_relu with one more generated layer, from `W_value2` `[head, d_head_v, d_head_v]`."""

    config_name = "hyper_deep"
    activation = "relu"
    has_tile_kernels = False  # its tiles go through forward() and autograd

    def __init__(self, n_heads: int, d_head_v: int):
        super().__init__(n_heads, d_head_v)
        # W_value2[h] maps the first hidden layer to the second: [n_heads, d_head_v, d_head_v].
        self.W_value2 = nn.Parameter(truncated_normal_std_(torch.empty(n_heads, d_head_v, d_head_v), d_head_v))
        self.hook_hidden2 = HookPoint()  # [batch, query, key, d_head_v]

    def forward(self, latent_codes: Tensor, values: Tensor) -> Tensor:
        hidden = self.first_layer(latent_codes, values)
        if self.n_heads < self.d_head_v:
            # Wide heads: sum_h a[h] (hidden W_value2[h]) holds [head, d_head_v] per pair instead
            # of the generated [d_head_v, d_head_v] weight; the same sum, reassociated.
            per_head = torch.einsum("bqkd,hde->bqkhe", hidden, self.W_value2)
            second = torch.einsum("bhqk,bqkhe->bqke", latent_codes, per_head)
        else:
            # sum_h a[h,q,k] W_value2[h] is the generated second-layer weight of each pair.
            generated = torch.einsum("bhqk,hde->bqkde", latent_codes, self.W_value2)
            second = torch.einsum("bqkd,bqkde->bqke", hidden, generated)
        hidden = self.hook_hidden2(torch.relu(second))
        return self.last_layer(latent_codes, hidden)

    def generated_layers(self, latent_codes: Tensor, W_V: Tensor, b_V: Tensor, W_O: Tensor) -> GeneratedLayers:
        (first, last), (first_bias, _), activations = super().generated_layers(latent_codes, W_V, b_V, W_O)
        second = rearrange(self.W_value2, "head d_in d_out -> head d_out d_in")
        return GeneratedLayers(weights=[first, _generate(latent_codes, second), last], biases=[first_bias, None, None],
                               activations=[*activations, "relu"])

    def floats_per_pair(self, d_model: int) -> int:
        return super().floats_per_pair(d_model) + self.d_head_v**2

    def floats_held_per_pair(self) -> int:
        width = self.d_head_v
        return 3 * width + min(self.n_heads, width) * width


VALUE_NETWORKS: dict[str, type[ValueNetwork]] = {
    network.config_name: network
    for network in (LinearValueNetwork, ReluLinearValueNetwork, HyperLinearValueNetwork, HyperReluValueNetwork,
                    HyperDeepValueNetwork)
}
"""Value network name -> class: the one place the names live (`ModelConfig` validates with it)."""
