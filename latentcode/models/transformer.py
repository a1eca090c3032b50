"""The hooked transformer: pre-LayerNorm blocks on TransformerLens's hook interface (`latentcode.models.hooks`).

    X_0 = embed(input)                                   hook_embed
    Z   = Attention(LayerNorm(X)) + X                    per block l
    Y   = MLP(LayerNorm(Z)) + Z
    out = LayerNorm(X_L) W_U + b_U                       [batch, pos, d_out]

Every activation passes through a `HookPoint` named as in TransformerLens, so `run_with_cache`,
`run_with_hooks` and `hooks()` work as they do for a TransformerLens model:

    hook_embed                                  [batch, pos, d_model]
    blocks.{l}.hook_resid_pre                   [batch, pos, d_model]
    blocks.{l}.ln1.hook_normalized              [batch, pos, d_model]   the attention's input
    blocks.{l}.attn.hook_q / hook_k             [batch, pos, head, d_head]
    blocks.{l}.attn.hook_v                      [batch, pos, head, d_head_v]
    blocks.{l}.attn.hook_rot_q / hook_rot_k     (rotary positions only)
    blocks.{l}.attn.hook_attn_scores            [batch, head, query_pos, key_pos]  after the position
                                                bias, before normalization (masked pairs unmasked)
    blocks.{l}.attn.hook_pattern                [batch, head, query_pos, key_pos]  the latent codes
    blocks.{l}.attn.value_network.hook_hidden   [batch, query_pos, key_pos, d_head_v]  (hyper_* only)
    blocks.{l}.attn.hook_z                      [batch, pos, head, d_head_v]
    blocks.{l}.hook_attn_out                    [batch, pos, d_model]
    blocks.{l}.hook_resid_mid                   [batch, pos, d_model]
    blocks.{l}.ln2.hook_normalized              [batch, pos, d_model]
    blocks.{l}.mlp.hook_pre / hook_post         [batch, pos, d_mlp]
    blocks.{l}.hook_mlp_out                     [batch, pos, d_model]
    blocks.{l}.hook_resid_post                  [batch, pos, d_model]
    ln_final.hook_normalized                    [batch, pos, d_model]

`hook_normalized` is the LayerNorm's output after its affine map: the exact input of the next
layer. On long sequences the attention layers compute blockwise unless a hook needs a whole
`[batch, head, query, key]` tensor: `latentcode.models.attention` says what each hook costs.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from latentcode.models.attention import Attention, InputShapeError
from latentcode.models.config import ModelConfig
from latentcode.models.feedforward import MLP, MixtureOfExperts, affine
from latentcode.models.hooks import HookedRootModule, HookPoint
from latentcode.models.initializers import embedding_normal, lecun_normal_
from latentcode.models.persistence import check_weights_fit, read_model_files, save_model

__all__ = ["InputShapeError", "LayerNorm", "Transformer", "build_model", "load_model"]


class LayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model))
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Tensor) -> Tensor:
        return self.hook_normalized(F.layer_norm(x, x.shape[-1:], self.w, self.b, self.eps))


class Embed(nn.Module):
    """Linear embedding of continuous or one-hot tokens `[batch, pos, d_in]` (`W_E` `[d_in, d_model]`)."""

    def __init__(self, d_in: int, d_model: int):
        super().__init__()
        self.W_E = nn.Parameter(lecun_normal_(torch.empty(d_in, d_model), d_in))
        self.b_E = nn.Parameter(torch.zeros(d_model))

    def forward(self, tokens: Tensor) -> Tensor:
        return affine(tokens, self.W_E, self.b_E)


class TokenEmbed(nn.Module):
    """Embedding table for integer tokens `[batch, pos]` (`W_E` `[d_vocab, d_model]`)."""

    def __init__(self, d_vocab: int, d_model: int):
        super().__init__()
        self.W_E = nn.Parameter(embedding_normal(d_vocab, d_model, fan_in=d_model))

    def forward(self, tokens: Tensor) -> Tensor:
        return self.W_E[tokens]


class Unembed(nn.Module):
    def __init__(self, d_model: int, d_out: int):
        super().__init__()
        self.W_U = nn.Parameter(lecun_normal_(torch.empty(d_model, d_out), d_model))
        self.b_U = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: Tensor) -> Tensor:
        return affine(x, self.W_U, self.b_U)


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        sizes = config.sizes
        self.ln1 = LayerNorm(sizes.d_model, config.layer_norm_eps)
        self.attn = Attention(config)
        self.ln2 = LayerNorm(sizes.d_model, config.layer_norm_eps)
        if config.ffn == "moe":
            self.mlp = MixtureOfExperts(sizes.d_model, sizes.d_mlp, config.n_experts, config.top_k_experts)
        else:
            self.mlp = MLP(sizes.d_model, sizes.d_mlp)
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid_pre: Tensor) -> Tensor:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid_pre)))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_mid)))
        return self.hook_resid_post(resid_mid + mlp_out)


class Transformer(HookedRootModule):
    """A hooked transformer built from a `ModelConfig` (see the module docstring for the hooks).

    `forward(tokens)` takes `[batch, pos, d_in]` floats (models with `d_in`) or `[batch, pos]`
    integers (models with `d_vocab`), `pos <= n_ctx`, and returns `[batch, pos, d_out]`.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        sizes = config.sizes
        linear = config.d_in is not None
        self.embed = Embed(config.d_in, sizes.d_model) if linear else TokenEmbed(config.d_vocab, sizes.d_model)
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.ln_final = LayerNorm(sizes.d_model, config.layer_norm_eps)
        self.unembed = Unembed(sizes.d_model, config.output_dim)
        self.setup()  # names every HookPoint after all submodules exist (HookedRootModule)

    def check_input(self, tokens: Tensor) -> None:
        config = self.config
        if not isinstance(tokens, Tensor):
            raise TypeError(f"expected a torch.Tensor as input, got {type(tokens).__name__}")
        if config.d_in is not None:
            expected = f"[batch, pos <= {config.n_ctx}, d_in={config.d_in}] floating point"
            shape_fits = tokens.ndim == 3 and tokens.shape[-1] == config.d_in
            dtype_fits = tokens.is_floating_point()
        else:
            expected = f"[batch, pos <= {config.n_ctx}] integer tokens < d_vocab={config.d_vocab}"
            shape_fits = tokens.ndim == 2
            dtype_fits = not tokens.is_floating_point() and tokens.dtype != torch.bool
        if not shape_fits:
            raise InputShapeError(f"expected input of shape {expected}, got shape {list(tokens.shape)}")
        if not dtype_fits:
            raise InputShapeError(f"expected input of shape {expected}, got dtype {tokens.dtype}")
        n_positions = tokens.shape[1]
        if n_positions > config.n_ctx:
            raise InputShapeError(
                f"input has {n_positions} positions but the model accepts at most n_ctx={config.n_ctx} "
                f"(shape {list(tokens.shape)}); build the model with a larger n_ctx"
            )
        if n_positions == 0 or tokens.shape[0] == 0:
            raise InputShapeError(f"expected a non-empty input {expected}, got shape {list(tokens.shape)}")

    def forward(self, tokens: Tensor) -> Tensor:
        self.check_input(tokens)
        if tokens.is_floating_point() and tokens.dtype != self.embed.W_E.dtype and not torch.is_autocast_enabled():
            tokens = tokens.to(self.embed.W_E.dtype)
        residual = self.hook_embed(self.embed(tokens))
        for block in self.blocks:
            residual = block(residual)
        return self.unembed(self.ln_final(residual))

    # -- persistence -----------------------------------------------------------------------------
    def save(self, path: str | Path, overwrite: bool = False, dtype: torch.dtype | None = None) -> Path:
        """Write `config.json` and `model.safetensors` into the directory `path` (see `persistence`)."""
        return save_model(self, path, overwrite=overwrite, dtype=dtype)

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    @property
    def n_heads(self) -> int:
        return self.config.sizes.n_heads


def build_model(config: ModelConfig, seed: int | None = None) -> Transformer:
    """Build a freshly initialized hooked transformer; `seed` makes the initialization reproducible."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"build_model expects a ModelConfig, got {type(config).__name__}")
    if seed is None:
        return Transformer(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Transformer(config)


def load_model(path: str | Path, device: str | torch.device = "cpu") -> Transformer:
    """Load a model saved by `model.save(path)` (see `latentcode.models.persistence`); in eval mode.

    Every stored weight must match the shape the stored config implies; what differs is named.
    """
    config, state = read_model_files(path, device)
    model = build_model(config).to(device)
    check_weights_fit(state, model.state_dict(), path)
    model.load_state_dict(state)  # copies into the model's float32 parameters, whatever the stored type
    return model.eval()
