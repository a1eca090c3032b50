"""Patching sweeps and attribution patching (issue 22).

- A gradient reaches the tensors of AddVector / SetCode / ScaleHeads and equals finite differences.
- The sweep, which patches many groups in one forward pass, equals one Interchange per group and
  the replacement of the group's codes done by hand with hooks.
- On a model whose metric is linear in the codes (one SDPA layer, a linear read-out), attribution
  patching equals exact patching for every group and example: the first-order estimate is exact.
- Bad calls are refused with what was wrong.
"""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from latentcode import ModelConfig, build_model
from latentcode.errors import UsageError
from latentcode.intervention import AddVector, Interchange, Intervention, ScaleHeads, SetCode
from latentcode.intervention.patching import (
    SiteGroup,
    attribution_patching,
    compare_attribution,
    head_grid,
    patching_sweep,
    site_grid,
)
from latentcode.sources.sites import block

CONFIG = dict(n_layers=2, d_model=8, n_heads=2, kqv_dim=8, d_mlp=8, n_ctx=5, d_in=3, d_out=4)


def tiny(attention="hyla"):
    return build_model(ModelConfig(attention=attention, **CONFIG), seed=0).eval().double()


def inputs(seed, batch=3):
    return torch.randn(batch, 5, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def metric(output):  # one number per example, differentiable
    return output[:, -1, 1] - output[:, -1, 0]


@pytest.mark.parametrize("make_edit", [
    lambda v: AddVector(v),
    lambda v: SetCode(v + 0.3),
    lambda v: ScaleHeads(v + 1.0),
])
def test_a_gradient_reaches_the_edit_tensor_and_equals_finite_differences(make_edit):
    model, x = tiny(), inputs(1)
    vector = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    with Intervention(model, make_edit(vector), sites="*:-1:*"):
        metric(model(x)).sum().backward()
    assert vector.grad is not None and vector.grad.abs().sum() > 0
    for head in range(2):
        step = torch.zeros(2, dtype=torch.float64)
        step[head] = 1e-6
        with torch.no_grad():
            with Intervention(model, make_edit(vector.detach() + step), sites="*:-1:*"):
                up = metric(model(x)).sum()
            with Intervention(model, make_edit(vector.detach() - step), sites="*:-1:*"):
                down = metric(model(x)).sum()
        assert vector.grad[head].item() == pytest.approx(((up - down) / 2e-6).item(), rel=1e-5, abs=1e-8)


def patched_by_hand(model, base, donor, group):
    """The model's output on `base` with the group's codes replaced by `donor`'s, through plain
    hooks on `blocks.L.attn.hook_pattern` (TransformerLens's way), none of the intervention code."""
    _, donor_cache = model.run_with_cache(donor)
    heads = list(range(model.config.n_heads)) if group.heads is None else list(group.heads)
    sites = group.selector.resolve(model.config.n_layers, base.shape[1])

    def replace(layer):
        def hook(codes, hook):
            codes = codes.clone()
            donor_codes = donor_cache[f"blocks.{layer}.attn.hook_pattern"]
            for site in sites:
                if site.layer == layer:
                    codes[:, heads, site.query, site.key] = donor_codes[:, heads, site.query, site.key]
            return codes
        return hook

    layers = sorted({site.layer for site in sites})
    return model.run_with_hooks(base, fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", replace(layer))
                                                 for layer in layers])


@pytest.mark.parametrize("attention", ["softmax", "hyla"])
def test_the_sweep_equals_one_interchange_per_group(attention):
    """The sweep's patched metric per group equals one Interchange per group and the same
    replacement done by hand with hooks on the codes."""
    model, base, donor = tiny(attention), inputs(1), inputs(2)
    groups = site_grid(2, 5, queries=[2, 4], key_blocks=2) + head_grid(2, 2, sites="*:-1:*")
    sweep = patching_sweep(model, base, donor, groups, metric, groups_per_pass=3)
    assert sweep.forward_passes == 2 + -(-len(groups) // 3)
    with torch.no_grad():
        unpatched = metric(model(base))
        for group, patched in zip(groups, sweep.patched["metric"], strict=True):
            edit = Interchange.from_inputs(model, donor, sites=group.selector, heads=group.heads)
            with Intervention(model, edit, sites=group.selector):
                expected = metric(model(base))
            torch.testing.assert_close(torch.as_tensor(patched).double(), expected, rtol=1e-5, atol=1e-6)
            by_hand = metric(patched_by_hand(model, base, donor, group))
            torch.testing.assert_close(torch.as_tensor(patched).double(), by_hand, rtol=1e-5, atol=1e-6)
    table = sweep.table
    assert len(table) == len(groups) and set(table.columns) >= {"layer", "effect", "effect_se", "n", "metric", "metric_se", "metric_base"}
    assert table["metric_base"].iloc[0] == pytest.approx(unpatched.mean().item(), rel=1e-5)
    assert not (sweep.effects == 0).all()  # the donor differs, so some group moves the metric


class LinearInCodes(nn.Module):
    """One attention layer through SDPA and a linear read-out: the output is linear in the
    attention probabilities, so a metric linear in the output is linear in the codes."""

    def __init__(self, d_model=8, n_heads=2):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.embed = nn.Linear(3, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, 4)

    def forward(self, x):
        h = self.embed(x)
        batch, length, _ = h.shape
        q, k, v = self.qkv(h).view(batch, length, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        mixed = F.scaled_dot_product_attention(q, k, v)
        return self.out(mixed.transpose(1, 2).reshape(batch, length, -1))


def test_attribution_equals_exact_patching_where_the_metric_is_linear_in_the_codes():
    torch.manual_seed(0)
    model = LinearInCodes().double().eval()
    base, donor = inputs(3, batch=4), inputs(4, batch=4)
    groups = site_grid(1, 5, key_blocks=2) + [SiteGroup(block(0, None, None), heads=(1,))]
    sweep = patching_sweep(model, base, donor, groups, metric)
    attribution = attribution_patching(model, base, donor, metric, sites="0:*:*")
    estimate = attribution.for_groups(groups)
    # the SDPA source recomputes probabilities in float32
    torch.testing.assert_close(torch.as_tensor(estimate).double(), torch.as_tensor(sweep.effects).double(), rtol=1e-4, atol=1e-6)
    assert compare_attribution(sweep, attribution)["pearson"] == pytest.approx(1.0)
    assert abs(sweep.effects).max() > 1e-3


def test_attribution_on_our_models_matches_a_small_step_along_the_patch():
    """Nonlinear models: the estimate is the derivative along (donor - base) at the base codes."""
    model, base, donor = tiny("hyla"), inputs(1), inputs(2)
    attribution = attribution_patching(model, base, donor, metric, sites="1:*:*")
    group = SiteGroup(block(1, 4, None))
    estimate = attribution.for_groups([group])[0]
    eps = 1e-6
    donor_codes = attribution.differences[1]
    queries, keys = attribution.positions[1]
    row = (queries == 4)

    class Step(AddVector):
        def replacement(self, codes, sites):
            return codes + eps * donor_codes[:, :, row].to(codes.dtype)

    with torch.no_grad(), Intervention(model, Step(torch.zeros(2)), sites="1:4:*"):
        stepped = metric(model(base))
    with torch.no_grad():
        unpatched = metric(model(base))
    torch.testing.assert_close(((stepped - unpatched) / eps), torch.as_tensor(estimate), rtol=1e-4, atol=1e-6)
    # the gradient was taken without touching the parameters' .grad
    assert all(parameter.grad is None for parameter in model.parameters())


def test_attribution_of_an_early_layer_counts_the_paths_through_later_layers_codes():
    """With every layer selected, layer 0's estimate is the total derivative: a small step along
    layer 0's patch also moves layer 1's codes (computed from layer 0's output), and the estimate
    must include that path, not only the one through layer 0's value network."""
    model, base, donor = tiny("hyla"), inputs(1), inputs(2)
    attribution = attribution_patching(model, base, donor, metric, sites="*:*:*")
    estimate = attribution.for_groups([SiteGroup(block(0, None, None))])[0]
    difference = attribution.differences[0]
    eps = 1e-6

    class Step(AddVector):
        def replacement(self, codes, sites):
            return codes + eps * difference.to(codes.dtype)

    with torch.no_grad(), Intervention(model, Step(torch.zeros(2)), sites="0:*:*"):
        stepped = metric(model(base))
    with torch.no_grad():
        unpatched = metric(model(base))
    torch.testing.assert_close((stepped - unpatched) / eps, torch.as_tensor(estimate), rtol=1e-4, atol=1e-6)
    # selecting layer 0 alone gives the same estimate: it is the total derivative either way
    only_layer_0 = attribution_patching(model, base, donor, metric, sites="0:*:*").for_groups([SiteGroup(block(0, None, None))])[0]
    torch.testing.assert_close(torch.as_tensor(only_layer_0), torch.as_tensor(estimate))


def test_attribution_from_recorded_donor_codes_equals_attribution_from_donor_inputs():
    from latentcode.intervention.patching import record_codes

    model, base, donor = tiny("hyla"), inputs(1), inputs(2)
    from_inputs = attribution_patching(model, base, donor, metric)
    codes, _ = record_codes(model, donor)
    from_codes = attribution_patching(model, base, None, metric, donor_codes=codes)
    for layer in from_inputs.effects:
        torch.testing.assert_close(from_codes.effects[layer], from_inputs.effects[layer], rtol=0, atol=0)
    wrong = {layer: value[:, :, :-1] for layer, value in codes.items()}
    with pytest.raises(UsageError, match=r"donor_codes of layer 0: expected \[batch, head, pairs\]"):
        attribution_patching(model, base, None, metric, donor_codes=wrong)
    with pytest.raises(UsageError, match="give donor_inputs, or donor_codes"):
        attribution_patching(model, base, None, metric)


def test_bad_calls_are_refused():
    model, base = tiny(), inputs(1)
    with pytest.raises(UsageError, match="same shape"):
        patching_sweep(model, base, inputs(2, batch=2), site_grid(2, 5, queries=[4]), metric)
    with pytest.raises(UsageError, match="one number per example"):
        patching_sweep(model, base, inputs(2), site_grid(2, 5, queries=[4]), lambda output: output.sum())
    with pytest.raises(UsageError, match="no site groups"):
        patching_sweep(model, base, inputs(2), [], metric)
    model.train()
    with pytest.raises(UsageError, match="training mode"):
        attribution_patching(model, base, inputs(2), metric)


def test_a_gradient_reaches_an_add_vector_through_an_sdpa_model():
    """The SDPA source keeps the fused output where an edit changes nothing; a zero AddVector that
    requires grad must still get its gradient."""
    torch.manual_seed(0)
    model = LinearInCodes().double().eval()
    vector = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    with Intervention(model, AddVector(vector), sites="0:-1:*"):
        metric(model(inputs(1))).sum().backward()
    assert vector.grad is not None and vector.grad.abs().sum() > 0


class HandWrittenAttention(nn.Module):
    """softmax(q k^T / sqrt(d)) @ v written by hand (as eager Hugging Face attention is)."""

    def __init__(self, d_model=8, n_heads=2):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, h):
        batch, length, _ = h.shape
        q, k, v = self.qkv(h).view(batch, length, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        probabilities = torch.softmax(q @ k.transpose(-1, -2) / self.d_head**0.5, dim=-1)
        return (probabilities @ v).transpose(1, 2).reshape(batch, length, -1)


class HandWrittenLinearInCodes(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(3, 8)
        self.attn = HandWrittenAttention()
        self.out = nn.Linear(8, 4)

    def forward(self, x):
        return self.out(self.attn(self.embed(x)))


def test_attribution_equals_exact_patching_on_hand_written_softmax_attention():
    from latentcode.sources.softmax_capture import SoftmaxSource

    torch.manual_seed(1)
    model = HandWrittenLinearInCodes().double().eval()
    base, donor = inputs(5, batch=4), inputs(6, batch=4)
    groups = site_grid(1, 5, queries=[4], key_blocks=5)
    sweep = patching_sweep(model, base, donor, groups, metric, source=SoftmaxSource(model, r"attn"))
    attribution = attribution_patching(model, base, donor, metric, sites="0:*:*", source=SoftmaxSource(model, r"attn"))
    torch.testing.assert_close(torch.as_tensor(attribution.for_groups(groups)), torch.as_tensor(sweep.effects),
                               rtol=1e-6, atol=1e-9)
    assert abs(sweep.effects).max() > 1e-3


def test_the_sweep_and_attribution_leave_the_processs_allocator_alone(monkeypatch):
    """`mallopt` changes malloc for the whole process: a library function never calls it (issue 46); only
    the command line or the user (`latentcode.keep_freed_memory()`) does. The spy stands where glibc's
    mallopt is looked up (`allocator._mallopt`), with the once-per-process memo cleared so a call would reach it."""
    import latentcode
    from latentcode import allocator

    monkeypatch.setattr(allocator, "_memory_kept", None)
    monkeypatch.setattr(allocator, "_mallopt", lambda: pytest.fail("a library function called mallopt"))
    model = tiny()
    base, donor = inputs(3, batch=2), inputs(4, batch=2)
    patching_sweep(model, base, donor, site_grid(2, 5, queries=[4]), metric)
    attribution_patching(model, base, donor, metric, sites="0:*:*")
    assert allocator._memory_kept is None

    calls = []
    monkeypatch.setattr(allocator, "_mallopt", lambda: lambda option, value: calls.append((option, value)) or 1)
    assert latentcode.keep_freed_memory()
    assert calls == [(-3, 32 * 2**20), (-1, 2**30)]  # glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD


def test_the_heads_grid_reads_a_negative_layer_from_the_end_and_all_pairs_as_every_pair():
    # --grid heads --sites -1:*:* made no group (the plan counted n_heads of them): the requested layer -1 was
    # compared with the swept layer 3 as it was written.
    def cells(groups):
        return [(group.coordinates, group.selector.requests) for group in groups]

    last = head_grid(4, 2, sites="3:*:*")
    assert len(last) == 2
    assert cells(head_grid(4, 2, sites="-1:*:*")) == cells(last)
    assert cells(head_grid(4, 2, sites="-1:*:*", layers=[3])) == cells(last)
    assert cells(head_grid(4, 2, sites="all-pairs:-1")) == cells(last)
    assert head_grid(4, 2, sites="-1:*:*", layers=[0, 1, 2]) == []
