"""Interventions through TorchAttentionSource: SDPA and nn.MultiheadAttention models, not edited.

References are written by hand: softmax(QKᵀ·scale + mask) from the call's own inputs, edited at the
chosen pairs, times V (for MultiheadAttention: the hand-written in-projection of V, bias_v and the
zero key, then the out-projection)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from latentcode.extraction import Recorder
from latentcode.intervention import CannotIntervene, Interchange, Intervention, SetCode, ZeroAblate
from latentcode.models.hook_state import any_hooks
from latentcode.sources import AdapterSource
from latentcode.store import Site
from tests.extraction.torch_models import MHA_CASES, SDPA_CASES, MhaModel, SdpaModel, mha_case

BATCH, LENGTH = 3, 6


class OneSdpa(nn.Module):
    """One attention layer through F.scaled_dot_product_attention: [batch, pos, 3] -> [batch, head, pos, d]."""

    def __init__(self, n_heads=4, n_kv_heads=4, d_head=5, heads_axis=True, **sdpa_kwargs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head, self.heads_axis = n_heads, n_kv_heads, d_head, heads_axis
        self.q = nn.Linear(3, n_heads * d_head)
        self.kv = nn.Linear(3, 2 * n_kv_heads * d_head)
        self.sdpa_kwargs = sdpa_kwargs

    def qkv(self, x):
        batch, length, _ = x.shape
        q = self.q(x).view(batch, length, self.n_heads, self.d_head).transpose(1, 2)
        k, v = self.kv(x).view(batch, length, 2, self.n_kv_heads, self.d_head).permute(2, 0, 3, 1, 4)
        if not self.heads_axis:
            q, k, v = q[:, 0], k[:, 0], v[:, 0]
        return q, k, v

    def forward(self, x, attn_mask=None):
        return F.scaled_dot_product_attention(*self.qkv(x), attn_mask=attn_mask, **self.sdpa_kwargs)


def by_hand(module, x, attn_mask, edit_probabilities):
    """softmax(QKᵀ·scale + mask) edited by `edit_probabilities`, times V: written out."""
    q, k, v = module.qkv(x)
    kwargs = module.sdpa_kwargs
    if kwargs.get("enable_gqa"):
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scale = kwargs.get("scale") or 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    if kwargs.get("is_causal"):
        scores = scores.masked_fill(~torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril(), float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    probabilities = torch.softmax(scores, dim=-1)
    return edit_probabilities(probabilities.clone()) @ v


ONE_SDPA_CASES = {
    "plain": ({}, None),
    "causal": ({"is_causal": True}, None),
    "bool-mask": ({}, lambda: torch.rand(BATCH, 1, LENGTH, LENGTH, generator=torch.Generator().manual_seed(1)) > 0.3),
    "float-mask-scale": ({"scale": 0.3}, lambda: torch.randn(LENGTH, LENGTH, generator=torch.Generator().manual_seed(2))),
    "gqa": ({"n_kv_heads": 2, "enable_gqa": True}, None),
    "no-head-axis": ({"heads_axis": False}, None),
}


@pytest.mark.parametrize("case", list(ONE_SDPA_CASES))
def test_an_sdpa_edit_equals_attention_written_by_hand_with_the_edited_probabilities(case):
    torch.manual_seed(0)
    kwargs, make_mask = ONE_SDPA_CASES[case]
    module = OneSdpa(**kwargs).eval()
    x = torch.randn(BATCH, LENGTH, 3)
    attn_mask = make_mask() if make_mask else None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = attn_mask | torch.eye(LENGTH, dtype=torch.bool)
    heads = [0] if case == "no-head-axis" else [1, 3]
    value = torch.tensor([0.9, -0.5, 0.2, 0.4]) if case != "no-head-axis" else torch.tensor([0.9])
    edits = [SetCode(value.numpy(), heads=heads, sites="0:4:2,0:4:0"), ZeroAblate(heads=heads[:1], sites="0:1:1")]

    def edit(probabilities):
        view = probabilities if probabilities.dim() == 4 else probabilities[:, None]
        for key in (2, 0):
            view[:, heads, 4, key] = value[heads]
        view[:, heads[:1], 1, 1] = 0.0
        return probabilities

    with torch.no_grad():
        unedited = module(x, attn_mask)
        with Intervention(module, edits):
            edited = module(x, attn_mask)
        expected = by_hand(module, x, attn_mask, edit)
    torch.testing.assert_close(edited, expected, atol=1e-6, rtol=1e-6)
    assert (edited - unedited).abs().max() > 1e-3
    view, unedited_view = (t if t.dim() == 4 else t[:, None] for t in (edited, unedited))
    untouched = torch.ones(view.shape[:3], dtype=torch.bool)
    untouched[:, heads, 4] = False
    untouched[:, heads[:1], 1] = False
    assert torch.equal(view[untouched], unedited_view[untouched])  # the fused call's own output elsewhere


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_setting_every_sdpa_code_to_its_own_value_changes_no_bit(case):
    torch.manual_seed(0)
    kwargs, make_mask = SDPA_CASES[case]
    model = SdpaModel(**kwargs).eval()
    x = torch.randn(BATCH, LENGTH, 3)
    attn_mask = make_mask() if make_mask else None
    expected = model(x, attn_mask)
    identity = [Interchange.from_inputs(model, x, attn_mask, sites=f"all-pairs:{layer}") for layer in range(2)]
    with Intervention(model, identity, record="all-pairs:1") as intervention:
        output = model(x, attn_mask)
    assert torch.equal(output, expected)
    recorded = intervention.pop()
    assert all(np.array_equal(codes, identity[1].codes[site]) for site, codes in recorded.items())


def mha_by_hand(mha, query, key, kwargs, edit_probabilities):
    """MultiheadAttention with its per-head probabilities edited, written out: V projection, bias_v,
    zero key, heads, out-projection. Returns batch-first output and the edited probabilities."""
    _, probabilities = mha(query, key, key, need_weights=True, average_attn_weights=False, **kwargs)
    probabilities = edit_probabilities(probabilities.detach().clone())  # [batch, head, query, key]
    if not mha.batch_first:
        key = key.transpose(0, 1)
    w_v = mha.v_proj_weight if mha.in_proj_weight is None else mha.in_proj_weight.chunk(3)[2]
    b_v = mha.in_proj_bias.chunk(3)[2]
    v = key @ w_v.T + b_v  # [batch, key, embed]
    if mha.bias_v is not None:
        v = torch.cat([v, mha.bias_v.expand(v.shape[0], 1, -1)], dim=1)
    batch, n_keys, embed = v.shape
    heads = mha.num_heads
    v = v.view(batch, n_keys, heads, embed // heads).transpose(1, 2)
    if mha.add_zero_attn:
        v = torch.cat([v, torch.zeros(batch, heads, 1, embed // heads)], dim=2)
    mixed = (probabilities @ v).transpose(1, 2).reshape(batch, -1, embed)
    return mha.out_proj(mixed), probabilities


@pytest.mark.parametrize("case", MHA_CASES)
def test_multihead_attention_edits_equal_a_hand_computation_and_identity_changes_no_bit(case):
    torch.manual_seed(0)
    mha, query, key, kwargs = mha_case(case)
    mha.eval()
    model = MhaModel(mha)
    expected = model(query, key, **kwargs)
    _, weights = mha(query, key, key, need_weights=True, average_attn_weights=False, **kwargs)
    n_queries, n_keys = weights.shape[-2:]
    every_pair = [(0, q, k) for q in range(n_queries) for k in range(n_keys)]
    with Intervention(model, Interchange.from_inputs(model, query, key, sites=every_pair, **kwargs)):
        assert torch.equal(model(query, key, **kwargs), expected)

    def edit(probabilities):
        probabilities[:, 2, 3, 1] = 0.8
        probabilities[:, :, 0, 0] = 0.0
        return probabilities

    with Intervention(model, [SetCode(np.full(4, 0.8, np.float32), heads=[2], sites="0:3:1"), ZeroAblate(sites="0:0:0")]):
        edited = model(query, key, **kwargs)
        _, edited_weights = mha(query, key, key, need_weights=True, average_attn_weights=False, **kwargs)
    batch_first = (lambda t: t) if mha.batch_first else (lambda t: t.transpose(0, 1))
    reference, edited_probabilities = mha_by_hand(mha, query, key, kwargs, edit)
    torch.testing.assert_close(batch_first(edited), reference, atol=1e-5, rtol=1e-5)
    changed_rows = [0, 3]
    unchanged = [row for row in range(n_queries) if row not in changed_rows]
    assert torch.equal(batch_first(edited)[:, unchanged], batch_first(expected)[:, unchanged])
    torch.testing.assert_close(edited_weights[:, :, changed_rows], edited_probabilities[:, :, changed_rows])
    assert torch.equal(edited_weights[:, :, unchanged], weights[:, :, unchanged])


def test_calls_with_dropout_are_refused_in_training_mode():
    model = OneSdpa(dropout_p=0.1)
    with pytest.raises(CannotIntervene, match=r"attention call 0 \(\(root\)\): .*dropout_p=0.1.*model.eval\(\)"):
        with Intervention(model, ZeroAblate()):
            model(torch.randn(2, LENGTH, 3))
    mha = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)
    model = MhaModel(mha)
    x = torch.randn(2, LENGTH, 8)
    with pytest.raises(CannotIntervene, match="dropout_p=0.1"):
        with Intervention(model, ZeroAblate()):
            model(x, x)
    with Intervention(model.eval(), ZeroAblate()):
        model(x, x)


def test_interception_and_hooks_are_gone_after_the_context_and_after_an_exception():
    model = SdpaModel().eval()
    x = torch.randn(BATCH, LENGTH, 3)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    with pytest.raises(RuntimeError, match="boom"):
        with Intervention(model, ZeroAblate()):
            assert torch._C._len_torch_function_stack() == 1
            model(x)
            raise RuntimeError("boom")
    assert torch._C._len_torch_function_stack() == 0
    assert torch.backends.mha.get_fastpath_enabled() == fastpath
    assert not any_hooks(model.modules())
    with Recorder(model, "all-pairs:0") as recorder:  # afterwards the model computes as before
        output = model(x)
    assert torch.equal(output, model(x)) and len(recorder.pop()) == LENGTH * LENGTH


def test_adapter_source_cannot_edit():
    model = SdpaModel().eval()
    source = AdapterSource(model, ["blocks.0.attn"], lambda module, args, kwargs, output: torch.zeros(1, 1, 1, 1))
    with pytest.raises(CannotIntervene, match="AdapterSource cannot edit latent codes") as raised:
        with Intervention(model, ZeroAblate(), source=source):
            pass
    assert "\n" not in str(raised.value)
    assert not any_hooks(model.modules())


def test_a_site_of_a_layer_the_model_does_not_have_is_named():
    model = SdpaModel(n_layers=2).eval()
    with pytest.raises(ValueError, match=r"layer\(s\) \[3\] .* ran only 2 attention layers"):
        with Intervention(model, ZeroAblate(), sites="3:0:0,0:0:0"):
            model(torch.randn(BATCH, LENGTH, 3))
    assert Site(0, 0, 0)  # sites are the store's
