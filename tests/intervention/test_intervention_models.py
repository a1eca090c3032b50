"""Interventions on our own models: the identity edit changes no bit for every attention preset, a
non-trivial edit equals the slow reference of tests/models/reference.py run with the edited pattern,
recording in the same pass sees the edited codes, hooks are gone after the context, and bad input
gives a one-line error."""

import numpy as np
import pytest
import torch

from latentcode import ATTENTION_PRESETS, ModelConfig, build_model
from latentcode.errors import UsageError
from latentcode.extraction import Recorder
from latentcode.intervention import (
    AddVector,
    CodesOfAnotherModel,
    EditError,
    Interchange,
    Intervention,
    MeanAblate,
    ScaleHeads,
    SetCode,
    ZeroAblate,
)
from latentcode.models.hook_state import attached_hooks
from latentcode.provenance import sha256_of_state
from latentcode.sources import SiteError
from latentcode.store import CodeWriter, Site
from tests.models.reference import (
    reference_attention,
    reference_attention_with_pattern,
    reference_mlp,
    reference_position_bias,
)

TINY = dict(n_layers=2, d_model=6, n_heads=3, kqv_dim=6, v_dim=6, d_mlp=8, n_ctx=5, d_in=3, d_out=2)
BATCH, LENGTH = 2, 5


def tiny_model(attention, seed=0, **overrides):
    model = build_model(ModelConfig(attention=attention, **{**TINY, **overrides}), seed=seed).eval()
    with torch.no_grad():  # non-zero biases, so that every bias enters
        for name, parameter in model.named_parameters():
            if name.split(".")[-1] in ("b_Q", "b_K", "b_V", "b_O", "b", "b_in", "b_out"):
                parameter.copy_(0.3 * torch.randn_like(parameter))
    return model


def inputs(seed=1):
    return torch.randn(BATCH, LENGTH, TINY["d_in"], generator=torch.Generator().manual_seed(seed))


def all_hooks(model):
    return [hook for module in model.modules() for hook in (*attached_hooks(module).forward, *attached_hooks(module).forward_pre)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attention", list(ATTENTION_PRESETS))
def test_setting_every_code_to_its_own_value_changes_no_bit(attention, causal):
    """The identity edit leaves every bit alone; the same edits built from another input do act:
    they give the formulas' output with every code replaced by that input's codes (so an
    intervention that did nothing would fail here)."""
    model = tiny_model(attention, causal=causal)
    x, other = inputs(), inputs(seed=2)
    with torch.no_grad():
        expected = model(x)
        identity = [Interchange.from_inputs(model, x, sites=f"all-pairs:{layer}") for layer in range(2)]
        with Recorder(model, "*:-1:-1") as recorder:
            model(x)
        own = recorder.pop()[Site(1, LENGTH - 1, LENGTH - 1)]  # one vector per example
        with Intervention(model, [*identity, SetCode(own, sites="1:-1:-1")]):
            edited = model(x)
        donors = [Interchange.from_inputs(model, other, sites=f"all-pairs:{layer}") for layer in range(2)]
        with Intervention(model, donors):
            interchanged = model(x)
        _, other_codes = reference_model(model, other, lambda layer, a: a)
        expected_interchanged, _ = reference_model(model, x, lambda layer, a: other_codes[layer])
    assert torch.equal(edited, expected)
    assert (expected_interchanged - expected).abs().max() > 1e-3  # the other input's codes matter
    torch.testing.assert_close(interchanged, expected_interchanged, atol=1e-5, rtol=1e-5)


def reference_model(model, x, edit_pattern):
    """The whole model from the formulas (tests/models/reference.py), each layer's latent codes
    passed through `edit_pattern(layer, a)` before the value network. Returns (output, patterns)."""
    config = model.config
    residual = x @ model.embed.W_E + model.embed.b_E
    patterns = []
    allowed = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril() if config.causal else None
    for layer, block in enumerate(model.blocks):
        ln1 = torch.nn.functional.layer_norm(residual, (6,), block.ln1.w, block.ln1.b, 1e-6)
        _, a = reference_attention(block.attn, ln1, config.score_normalization, config.value_network,
                                   position_bias=reference_position_bias(block.attn.relative_position_bias.bias_table, LENGTH),
                                   allowed=allowed, eps=config.rms_head_eps)
        a = edit_pattern(layer, a.clone())
        patterns.append(a)
        residual = residual + reference_attention_with_pattern(block.attn, ln1, a, config.value_network)
        ln2 = torch.nn.functional.layer_norm(residual, (6,), block.ln2.w, block.ln2.b, 1e-6)
        residual = residual + reference_mlp(block.mlp, ln2)
    final = torch.nn.functional.layer_norm(residual, (6,), model.ln_final.w, model.ln_final.b, 1e-6)
    return final @ model.unembed.W_U + model.unembed.b_U, patterns


@pytest.mark.parametrize("attention", ["softmax", "linear", "hyla"])
def test_an_edit_equals_the_reference_computed_with_the_edited_pattern(attention):
    model = tiny_model(attention)
    x = inputs()
    value = np.array([0.7, -0.4, 1.3], dtype=np.float32)
    steer = np.array([[0.5, 0.0, -1.0], [2.0, 1.0, 0.0]], dtype=np.float32)  # one per example
    edits = [
        SetCode(value, heads=[1], sites="0:4:2"),
        ZeroAblate(heads=[0, 2], sites="1:4:4,1:0:3"),
        AddVector(steer, sites="1:2:2"),
        ScaleHeads(-2.0, heads=[2], sites="1:4:4"),  # after the zero-ablation: stays zero; head 1 untouched
    ]

    def edit_by_hand(layer, a):
        if layer == 0:
            a[:, 1, 4, 2] = float(value[1])
        else:
            a[:, [0, 2], 4, 4] = 0.0
            a[:, [0, 2], 0, 3] = 0.0
            a[:, :, 2, 2] += torch.from_numpy(steer)
        return a

    with torch.no_grad():
        unedited, _ = reference_model(model, x, lambda layer, a: a)
        expected, patterns = reference_model(model, x, edit_by_hand)
        with Intervention(model, edits, record="0:4:2,1:4:4,1:2:2,1:3:1") as intervention:
            edited = model(x)
    assert (expected - unedited).abs().max() > 1e-3  # the edit matters
    torch.testing.assert_close(edited, expected, atol=1e-5, rtol=1e-5)
    recorded = intervention.pop()  # the codes the layers computed with: edited where edited
    for site, codes in recorded.items():
        np.testing.assert_allclose(codes, patterns[site.layer][:, :, site.query, site.key].numpy(), atol=1e-5)
    assert (recorded[Site(0, 4, 2)][:, 1] == value[1]).all()


def test_hooks_are_removed_after_the_context_and_after_an_exception():
    model = tiny_model("hyla")
    with torch.no_grad():
        expected = model(inputs())
    assert all_hooks(model) == []
    with Intervention(model, ZeroAblate(), record="last-self"):
        assert all_hooks(model)
        model(inputs())
    assert all_hooks(model) == []
    with pytest.raises(RuntimeError, match="boom"):
        with Intervention(model, ZeroAblate()):
            model(inputs())
            raise RuntimeError("boom")
    assert all_hooks(model) == []
    with pytest.raises(SiteError):
        with Intervention(model, ZeroAblate(), sites="0:9:0"):
            model(inputs())
    assert all_hooks(model) == []
    with torch.no_grad():
        assert torch.equal(model(inputs()), expected)


def test_gradients_flow_through_an_edit():
    model = tiny_model("softmax")
    with Intervention(model, ScaleHeads(3.0, heads=[0])):
        model(inputs()).sum().backward()
    assert model.blocks[0].attn.W_Q.grad is not None and model.blocks[0].attn.W_Q.grad.abs().sum() > 0


def one_line_error(error_type, match, edit, sites="last-self", x=None, model=None):
    model = model or tiny_model("softmax")
    with pytest.raises(error_type, match=match) as raised:
        with Intervention(model, edit, sites=sites):
            model(inputs() if x is None else x)
    assert "\n" not in str(raised.value)


def test_bad_input_gives_one_line_errors():
    one_line_error(EditError, r"SetCode value has width 2 but the latent codes at layer 0 have 3 heads", SetCode([1.0, 2.0]))
    one_line_error(EditError, r"gives 5 vectors .* this forward pass has 2 examples", AddVector(np.ones((5, 3))))
    one_line_error(EditError, r"head 3 is outside the 3 heads .* \(valid: 0..2\)", ZeroAblate(heads=[3]))
    one_line_error(SiteError, r"position 7 is outside the sequence of 5 tokens", ZeroAblate(), sites="0:7:0")
    one_line_error(SiteError, r"layer 4 is outside the model's 2 layers", ZeroAblate(), sites="4:0:0")
    model = tiny_model("softmax")
    source = Interchange.from_inputs(model, torch.randn(3, LENGTH, 3), sites="last-self")
    one_line_error(EditError, r"source input has shape \[3, 5, 3\] but the model was called with shape \[2, 5, 3\]",
                   source, model=model)
    shorter = Interchange.from_inputs(model, torch.randn(BATCH, 4, 3), sites="last-self")
    one_line_error(EditError, r"source input has shape \[2, 4, 3\]", shorter, model=model)


def test_every_edit_checks_each_call_before_the_forward_pass():
    """`Intervention` asks each edit's `check_call` with the model's arguments before every pass, so an
    edit kind checks what it needs (as Interchange its input shape) without the intervention knowing it."""
    model, calls = tiny_model("softmax"), []

    class CheckedZeroAblate(ZeroAblate):
        def check_call(self, args, kwargs):
            calls.append((tuple(args[0].shape), sorted(kwargs)))
            if args[0].shape[0] > BATCH:
                raise EditError(f"at most {BATCH} examples")

    with torch.no_grad(), Intervention(model, [ZeroAblate(), CheckedZeroAblate()], sites="last-self"):
        model(inputs())
        with pytest.raises(EditError, match="at most 2 examples"):
            model(torch.randn(BATCH + 1, LENGTH, 3))
    assert calls == [((BATCH, LENGTH, 3), []), ((BATCH + 1, LENGTH, 3), [])]


def write_codes(path, model, codes, labels, sha=None):
    metadata = {"model_name": "tiny", "checkpoint_sha256": sha or sha256_of_state(model)}
    with CodeWriter(path, sorted(codes), 3, metadata) as writer:
        writer.append(codes=codes, labels=labels, split="train")


def test_mean_ablation_from_a_codes_file_sets_the_mean_code_overall_and_per_label(tmp_path):
    model = tiny_model("hyla")
    rng = np.random.default_rng(0)
    site = Site(1, LENGTH - 1, LENGTH - 1)
    stored = rng.normal(size=(40, 3)).astype(np.float32)
    rule = np.arange(40) % 4
    write_codes(tmp_path / "codes.h5", model, {site: stored}, {"rule": rule})
    x = inputs()

    def output(edit):
        with torch.no_grad(), Intervention(model, edit, sites=[site]):
            return model(x)

    overall = MeanAblate.from_codes(tmp_path / "codes.h5", heads=[0, 2], model=model)
    expected_mean = stored.astype(np.float64).mean(axis=0)
    with Recorder(model, [site]) as recorder:
        model(x)
    own = recorder.pop()[site]
    expected = own.copy()
    expected[:, [0, 2]] = expected_mean[[0, 2]]
    torch.testing.assert_close(output(overall), output(SetCode(expected)), atol=1e-6, rtol=1e-6)

    batch_rules = np.array([3, 1])
    by_rule = MeanAblate.from_codes(tmp_path / "codes.h5", by="rule", model=model).with_labels(batch_rules)
    per_example = np.stack([stored[rule == value].astype(np.float64).mean(axis=0) for value in batch_rules])
    torch.testing.assert_close(output(by_rule), output(SetCode(per_example)), atol=1e-6, rtol=1e-6)
    with pytest.raises(EditError, match=r"no mean for rule value 7: .* values \[0, 1, 2, 3\]"):
        output(by_rule.with_labels(np.array([7, 1])))
    # for_batch (what intervention_effects calls per batch) takes the batch's values of the edit's label.
    from_batch = by_rule.for_batch({"rule": batch_rules, "other": np.array([0, 0])})
    torch.testing.assert_close(output(from_batch), output(SetCode(per_example)), atol=1e-6, rtol=1e-6)
    assert overall.for_batch({"rule": batch_rules}) is overall, "overall means need nothing of the batch"
    with pytest.raises(UsageError, match=r"one mean per value of 'rule', .* their labels are \['other'\]"):
        by_rule.for_batch({"other": batch_rules})
    with pytest.raises(EditError, match=r"has no code at site \(layer 0, query 4, key 4\)"):
        with Intervention(model, overall, sites="0:-1:-1"):
            model(x)


def test_a_codes_file_of_another_model_is_refused_naming_both_hashes(tmp_path):
    model, other = tiny_model("hyla", seed=0), tiny_model("hyla", seed=1)
    site = Site(1, LENGTH - 1, LENGTH - 1)
    write_codes(tmp_path / "codes.h5", other, {site: np.zeros((4, 3), np.float32)}, {"rule": np.zeros(4, int)})
    with pytest.raises(CodesOfAnotherModel) as raised:
        MeanAblate.from_codes(tmp_path / "codes.h5", model=model)
    message = str(raised.value)
    assert sha256_of_state(other) in message and sha256_of_state(model) in message and "\n" not in message
    with pytest.raises(CodesOfAnotherModel, match="0" * 64):
        MeanAblate.from_codes(tmp_path / "codes.h5", checkpoint_sha256="0" * 64)
    MeanAblate.from_codes(tmp_path / "codes.h5", model=other)  # its own model: accepted


@pytest.mark.filterwarnings("ignore:.*contain NaN or inf:RuntimeWarning")  # the writer warns, and stores them
def test_mean_ablation_refuses_codes_with_nan_rows_naming_the_file_site_and_count(tmp_path):
    """A NaN row made every mean NaN and every edited output NaN, silently (issue 23)."""
    model = tiny_model("hyla")
    site = Site(1, LENGTH - 1, LENGTH - 1)
    stored = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    stored[[2, 7], 1] = np.nan
    write_codes(tmp_path / "codes.h5", model, {site: stored}, {"rule": np.arange(10) % 2})
    for by in (None, "rule"):
        with pytest.raises(EditError) as raised:
            MeanAblate.from_codes(tmp_path / "codes.h5", by=by, model=model)
        message = str(raised.value)
        assert "codes.h5" in message and str(site) in message and "2 of 10 rows" in message and "\n" not in message
    with pytest.raises(EditError, match="MeanAblate means holds 1 NaN"):
        with torch.no_grad(), Intervention(model, MeanAblate({site: np.array([0.1, np.nan, 0.2])}), sites=[site]):
            model(inputs())
