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

from latentcode.extraction import Recorder
from latentcode.sources import NoAttentionCaptured, SiteError, TorchAttentionSource, detect_source
from latentcode.store import Site
from tests.extraction.torch_models import (
    BATCH,
    LENGTH,
    MHA_CASES,
    SDPA_CASES,
    E,
    H,
    L,
    MhaModel,
    SdpaModel,
    mha_case,
)


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


def test_cross_attention_positions_resolve_against_their_own_axis():
    model = MhaModel(nn.MultiheadAttention(E, H, batch_first=True).eval())
    query, key = torch.randn(1, 2, E), torch.randn(1, 6, E)
    with Recorder(model, "last-self") as recorder:  # the last query (1 of 2), the last key (5 of 6)
        model(query, key)
    assert list(recorder.pop()) == [Site(0, 1, 5)]
    assert recorder.source.layers() == [{"name": "attn", "kind": "cross", "queries": 2, "keys": 6}]
    with pytest.raises(SiteError, match="position 5 is outside the query axis of 2 tokens"):
        with Recorder(model, "0:5:0"):
            model(query, key)
