"""TorchAttentionSource: SDPA and nn.MultiheadAttention captured without editing the model.

References are computed independently: the explicit softmax(QKᵀ·scale + mask) of the q, k and
mask each SDPA call received (the toy model keeps them), MultiheadAttention's own per-head
weights (need_weights=True, average_attn_weights=False), and a hand-written in-projection for
nn.TransformerEncoder.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from latentcode.extraction import NoAttentionCaptured, Recorder, TorchAttentionSource, detect_source
from latentcode.store import Site


def grid(codes: dict, layer: int, n_queries: int, n_keys: int | None = None) -> np.ndarray:
    """{Site: [N, H]} of all pairs of one layer -> [N, H, query, key]."""
    n_keys = n_queries if n_keys is None else n_keys
    return np.stack(
        [np.stack([codes[Site(layer, q, k)] for k in range(n_keys)], axis=-1) for q in range(n_queries)], axis=-2
    )


def explicit_attention(q, k, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, score="pattern"):
    """softmax(QKᵀ·scale + mask), written out: the reference for one SDPA call."""
    if enable_gqa:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    if is_causal:
        scores = scores.masked_fill(~torch.ones(n_queries, n_keys, dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    return scores if score == "scores" else torch.softmax(scores, dim=-1)


class SdpaAttention(nn.Module):
    """Attention through F.scaled_dot_product_attention; keeps each call's q, k for the reference."""

    def __init__(self, d_model, n_heads, n_kv_heads=None, heads_axis=True, **sdpa_kwargs):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads or n_heads
        self.d_head = d_model // n_heads
        self.heads_axis = heads_axis
        self.query = nn.Linear(d_model, d_model)
        self.key_value = nn.Linear(d_model, 2 * self.n_kv_heads * self.d_head)
        self.out = nn.Linear(d_model, d_model)
        self.sdpa_kwargs = sdpa_kwargs

    def forward(self, x, attn_mask=None):
        batch, length, _ = x.shape
        q = self.query(x).view(batch, length, self.n_heads, self.d_head).transpose(1, 2)
        k, v = self.key_value(x).view(batch, length, 2, self.n_kv_heads, self.d_head).transpose(1, 3).unbind(2)
        if not self.heads_axis:  # one head, [batch, sequence, dim]
            q, k, v = q[:, 0], k[:, 0], v[:, 0]
        self.seen = {"q": q.detach(), "k": k.detach(), "attn_mask": attn_mask}
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **self.sdpa_kwargs)
        if not self.heads_axis:
            mixed = mixed[:, None].expand(-1, self.n_heads, -1, -1)
        return self.out(mixed.transpose(1, 2).reshape(batch, length, -1))


class SdpaModel(nn.Module):
    def __init__(self, d_model=16, n_heads=4, n_layers=2, **attention_kwargs):
        super().__init__()
        self.embed = nn.Linear(3, d_model)
        self.blocks = nn.ModuleList()
        for _ in range(n_layers):
            block = nn.Module()
            block.attn = SdpaAttention(d_model, n_heads, **attention_kwargs)
            block.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))
            self.blocks.append(block)

    def forward(self, x, attn_mask=None):
        h = self.embed(x)
        for block in self.blocks:
            h = h + block.attn(h, attn_mask)
            h = h + block.mlp(h)
        return h


BATCH, LENGTH = 3, 6


def random_bool_mask():
    mask = torch.rand(BATCH, 1, LENGTH, LENGTH, generator=torch.Generator().manual_seed(1)) > 0.4
    return mask | torch.eye(LENGTH, dtype=torch.bool)  # every query keeps a key


SDPA_CASES = {
    "plain": ({}, None),
    "causal": ({"is_causal": True}, None),
    "bool-mask": ({}, random_bool_mask),
    "float-mask": ({}, lambda: torch.randn(LENGTH, LENGTH, generator=torch.Generator().manual_seed(2))),
    "scale": ({"scale": 0.3}, None),
    "gqa": ({"n_kv_heads": 2, "enable_gqa": True, "is_causal": True}, None),
    "no-head-axis": ({"heads_axis": False}, None),
}


@pytest.mark.parametrize("case", list(SDPA_CASES))
@pytest.mark.parametrize("score", ["pattern", "scores"])
def test_sdpa_codes_equal_explicit_softmax_of_the_intercepted_call(case, score):
    torch.manual_seed(0)
    kwargs, make_mask = SDPA_CASES[case]
    model = SdpaModel(**kwargs).eval()
    x = torch.randn(BATCH, LENGTH, 3)
    attn_mask = make_mask() if make_mask else None
    sdpa_kwargs = {name: value for name, value in kwargs.items() if name in ("is_causal", "scale", "enable_gqa")}
    for layer in range(2):
        with Recorder(model, f"all-pairs:{layer}", score=score) as recorder:
            model(x, attn_mask)
        seen = model.blocks[layer].attn.seen
        reference = explicit_attention(seen["q"], seen["k"], seen["attn_mask"], score=score, **sdpa_kwargs)
        if reference.dim() == 3:
            reference = reference[:, None]
        codes = recorder.pop()
        assert {site.layer for site in codes} == {layer}
        np.testing.assert_allclose(grid(codes, layer, LENGTH), reference.numpy(), rtol=1e-5, atol=1e-6)


def test_scores_mark_masked_entries_minus_infinity_and_softmax_to_the_pattern():
    torch.manual_seed(0)
    model = SdpaModel(is_causal=True).eval()
    x = torch.randn(BATCH, LENGTH, 3)
    with Recorder(model, "all-pairs:1", score="scores") as recorder:
        model(x)
    scores = grid(recorder.pop(), 1, LENGTH)
    above_diagonal = np.triu(np.ones((LENGTH, LENGTH), dtype=bool), k=1)
    assert np.isneginf(scores[..., above_diagonal]).all()
    assert np.isfinite(scores[..., ~above_diagonal]).all()
    with Recorder(model, "all-pairs:1") as recorder:
        model(x)
    pattern = grid(recorder.pop(), 1, LENGTH)
    np.testing.assert_allclose(torch.softmax(torch.from_numpy(scores), -1).numpy(), pattern, atol=1e-6)


def test_a_query_whose_keys_are_all_masked_gets_zeros_like_sdpa():
    model = SdpaModel().eval()
    mask = torch.ones(BATCH, 1, LENGTH, LENGTH, dtype=torch.bool)
    mask[1, :, 2, :] = False  # query 2 of example 1 may attend to nothing
    with Recorder(model, "0:2:0,0:2:3", score="pattern") as recorder:
        model(torch.randn(BATCH, LENGTH, 3), mask)
    codes = recorder.pop()
    assert (codes[Site(0, 2, 0)][1] == 0).all() and (codes[Site(0, 2, 0)][0] > 0).all()
    with Recorder(model, "0:2:0", score="scores") as recorder:
        model(torch.randn(BATCH, LENGTH, 3), mask)
    assert np.isneginf(recorder.pop()[Site(0, 2, 0)][1]).all()


def test_model_outputs_are_unchanged_and_only_selected_sites_are_kept():
    torch.manual_seed(0)
    model = SdpaModel(n_kv_heads=2, enable_gqa=True, is_causal=True).eval()
    x = torch.randn(BATCH, LENGTH, 3)
    expected = model(x)
    with Recorder(model, "last-self") as recorder:
        captured = model(x)
    assert torch.equal(captured, expected)
    codes = recorder.pop()
    assert sorted(codes) == [Site(0, LENGTH - 1, LENGTH - 1), Site(1, LENGTH - 1, LENGTH - 1)]
    assert all(value.shape == (BATCH, 4) and value.dtype == np.float32 for value in codes.values())


def test_layers_are_numbered_by_call_order_per_pass_and_named_by_module():
    torch.manual_seed(0)
    model = SdpaModel(n_layers=3).eval()
    source = TorchAttentionSource(model)
    assert source.layer_names() is None and source.n_layers() is None
    x = torch.randn(2, LENGTH, 3)
    with Recorder(model, "*:0:0", source=source) as recorder:
        model(x)
        q = torch.randn(1, 2, 4, 8)
        F.scaled_dot_product_attention(q, q, q)  # not made by the model: ignored
        model(x)
    assert source.layer_names() == ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]
    assert source.n_layers() == 3
    codes = recorder.pop()
    assert sorted(codes) == [Site(layer, 0, 0) for layer in range(3)]
    assert all(value.shape == (4, 4) for value in codes.values())  # two passes of 2 examples


def test_a_module_calling_sdpa_twice_gets_numbered_names():
    class TwoCalls(nn.Module):
        def forward(self, q, k):
            return F.scaled_dot_product_attention(q, k, k) + F.scaled_dot_product_attention(k, q, q)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.mixer = TwoCalls()

        def forward(self, q, k):
            return self.mixer(q, k) + F.scaled_dot_product_attention(q, q, q)

    model = Model()
    q, k = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    source = TorchAttentionSource(model)
    with Recorder(model, "*:1:2", source=source) as recorder:
        model(q, k)
    assert source.layer_names() == ["mixer", "mixer#1", "(root)"]
    codes = recorder.pop()
    np.testing.assert_allclose(codes[Site(1, 1, 2)], explicit_attention(k, q)[:, :, 1, 2].numpy(), rtol=1e-5)


# -- nn.MultiheadAttention ------------------------------------------------------------------------------
class MhaModel(nn.Module):
    def __init__(self, mha: nn.MultiheadAttention):
        super().__init__()
        self.attn = mha

    def forward(self, query, key, **kwargs):
        return self.attn(query, key, key, need_weights=False, **kwargs)[0]


L, S, E, H = 5, 7, 16, 4


def mha_case(name):
    """(MultiheadAttention, query, key, forward kwargs) for each configuration."""
    generator = torch.Generator().manual_seed(3)
    padding = torch.zeros(2, S, dtype=torch.bool)
    padding[1, 4:] = True
    if name == "batch-first-causal-padding":
        mha = nn.MultiheadAttention(E, H, batch_first=True)
        x = torch.randn(2, L, E, generator=generator)
        causal = torch.ones(L, L, dtype=torch.bool).triu(1)  # True: masked
        return mha, x, x, {"attn_mask": causal, "key_padding_mask": padding[:, :L], "is_causal": True}
    if name == "sequence-first-bool-mask":
        mha = nn.MultiheadAttention(E, H)
        x = torch.randn(L, 2, E, generator=generator)
        mask = torch.rand(L, L, generator=generator) > 0.6
        mask.fill_diagonal_(False)
        return mha, x, x, {"attn_mask": mask}
    if name == "cross-attention-kdim":
        mha = nn.MultiheadAttention(E, H, kdim=6, vdim=6, batch_first=True)
        return mha, torch.randn(2, L, E, generator=generator), torch.randn(2, S, 6, generator=generator), {
            "key_padding_mask": padding
        }
    if name == "bias-kv-zero-attn-per-head-mask":
        mha = nn.MultiheadAttention(E, H, add_bias_kv=True, add_zero_attn=True, batch_first=True)
        nn.init.normal_(mha.bias_k)
        x = torch.randn(2, L, E, generator=generator)
        return mha, x, x, {"attn_mask": torch.randn(2 * H, L, L, generator=generator)}
    raise KeyError(name)


MHA_CASES = ["batch-first-causal-padding", "sequence-first-bool-mask", "cross-attention-kdim", "bias-kv-zero-attn-per-head-mask"]


@pytest.mark.parametrize("case", MHA_CASES)
def test_multihead_attention_codes_equal_its_own_per_head_weights(case):
    torch.manual_seed(0)
    mha, query, key, kwargs = mha_case(case)
    model = MhaModel(mha.eval())
    _, reference = mha(query, key, key, need_weights=True, average_attn_weights=False, **kwargs)
    n_queries, n_keys = reference.shape[-2:]
    sites = [(0, q, k) for q in range(n_queries) for k in range(n_keys)]
    expected_output = model(query, key, **kwargs)
    source = TorchAttentionSource(model)
    with Recorder(model, sites, source=source) as recorder:
        output = model(query, key, **kwargs)
    assert torch.equal(output, expected_output)
    assert source.layer_names() == ["attn"]  # the SDPA call inside MultiheadAttention is not a second layer
    codes = grid(recorder.pop(), 0, n_queries, n_keys)
    np.testing.assert_allclose(codes, reference.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_transformer_encoder_with_padding_matches_a_hand_computed_reference():
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, batch_first=True), num_layers=2
    ).eval()
    x = torch.randn(3, L, 16)
    padding = torch.zeros(3, L, dtype=torch.bool)
    padding[1, 3:] = True
    padding[2, 4:] = True
    fast_output = encoder(x, src_key_padding_mask=padding)  # the nested-tensor fast path
    layer_inputs = []
    hooks = [layer.register_forward_pre_hook(lambda m, args: layer_inputs.append(args[0])) for layer in encoder.layers]
    source = TorchAttentionSource(encoder)
    with Recorder(encoder, "all-pairs:0", source=source) as rec0:
        assert not torch.backends.mha.get_fastpath_enabled()
        output = encoder(x, src_key_padding_mask=padding)
    with Recorder(encoder, "all-pairs:1", source=source) as rec1:
        encoder(x, src_key_padding_mask=padding)
    for hook in hooks:
        hook.remove()
    assert torch.backends.mha.get_fastpath_enabled()
    assert source.layer_names() == ["layers.0.self_attn", "layers.1.self_attn"]
    real = ~padding
    torch.testing.assert_close(output[real], fast_output[real], rtol=1e-4, atol=1e-5)
    for layer, recorder in enumerate([rec0, rec1]):
        attention = encoder.layers[layer].self_attn
        inputs = layer_inputs[layer].detach()  # the first captured pass: layer 0 then layer 1
        w_q, w_k, _ = attention.in_proj_weight.detach().chunk(3)
        b_q, b_k, _ = attention.in_proj_bias.detach().chunk(3)
        q = (inputs @ w_q.T + b_q).view(3, L, 4, 4).transpose(1, 2)
        k = (inputs @ w_k.T + b_k).view(3, L, 4, 4).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1) / 2.0).masked_fill(padding[:, None, None, :], float("-inf"))
        np.testing.assert_allclose(grid(recorder.pop(), layer, L), scores.softmax(-1).numpy(), rtol=1e-5, atol=1e-6)


def test_fast_path_setting_is_restored_after_an_error():
    model = SdpaModel().eval()
    before = torch.backends.mha.get_fastpath_enabled()
    with pytest.raises(RuntimeError, match="boom"):
        with Recorder(model, "last-self"):
            assert not torch.backends.mha.get_fastpath_enabled()
            raise RuntimeError("boom")
    assert torch.backends.mha.get_fastpath_enabled() == before


def test_a_model_without_capturable_attention_raises_a_clear_error():
    mlp = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 3))
    assert isinstance(detect_source(mlp), TorchAttentionSource)
    with pytest.raises(NoAttentionCaptured, match="no latent code was captured from Sequential.*AdapterSource"):
        with Recorder(mlp, "last-self"):
            mlp(torch.randn(2, 5, 3))


def test_asking_for_a_query_beyond_the_calls_queries_is_a_clear_error():
    model = MhaModel(nn.MultiheadAttention(E, H, batch_first=True).eval())
    query, key = torch.randn(1, 2, E), torch.randn(1, 6, E)
    with pytest.raises(IndexError, match="2 queries and 6 keys"):
        with Recorder(model, "last-self"):
            model(query, key)
