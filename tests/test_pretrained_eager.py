"""Causal LMs that transformers runs only with eager attention (issue 47 item 4): a tiny random Gemma 2
(soft-capped scores; sliding-window and global layers alternate) and a tiny gpt-oss (attention sinks;
a sliding-window layer and a global one), saved with a tokenizer, load with eager attention and their
codes are read exactly: the compact store's rebuilt rows and the sites' codes equal transformers' own
eager `output_attentions` within 1e-5. Each test also shows the term it checks matters: dropping the
cap, the window or the sinks from the rebuild moves the codes by far more than the tolerance. An
eager attention with a term latentcode does not read is refused in one line naming the model type."""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest
import torch
import transformers

import latentcode
from latentcode.errors import LatentcodeError
from latentcode.store.compact import LayerMask, query_name, rebuild_rows
from tests.pretrained_models import VOCAB_SIZE, tiny_tokenizer

# float32 rounding separates the rebuild from eager attention (the largest seen is printed with -s)
TOLERANCE = 1e-5
# a dropped term must move some code by at least this (many times the tolerance)
MATTERS = 1e-2
SEQ_LEN, WINDOW = 24, 8  # the window masks keys of every row past the 8th
SMALL = dict(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


def save_tiny(directory, architecture: str):
    """A random model of `architecture` and its tokenizer in `directory`. Its query and key projections
    are drawn large (std 0.5, not transformers' 0.02), so that scores reach the soft cap and the
    attention is far from uniform: a rebuild that drops a term is visibly wrong."""
    torch.manual_seed(0)
    if architecture == "gemma2":
        # layer 0 sliding (window 8), layer 1 global: Gemma 2's alternation; scores capped at 5
        config = transformers.Gemma2Config(**SMALL, sliding_window=WINDOW, attn_logit_softcapping=5.0,
                                           query_pre_attn_scalar=8, final_logit_softcapping=30.0,
                                           architectures=["Gemma2ForCausalLM"])
        model = transformers.Gemma2ForCausalLM(config)
    else:
        config = transformers.GptOssConfig(**SMALL, sliding_window=WINDOW, num_local_experts=2, num_experts_per_tok=1,
                                           layer_types=["sliding_attention", "full_attention"],
                                           architectures=["GptOssForCausalLM"])
        model = transformers.GptOssForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.normal_(std=0.5)
            layer.self_attn.k_proj.weight.normal_(std=0.5)
            if architecture == "gpt_oss":  # one sink logit per head, from absorbing little to most of a row
                layer.self_attn.sinks.copy_(torch.linspace(-2.0, 3.0, SMALL["num_attention_heads"]))
    model.eval().save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


ARCHITECTURES = [pytest.param(name, marks=pytest.mark.skipif(
    not hasattr(transformers, config), reason=f"transformers {transformers.__version__} has no {config}"))
    for name, config in (("gemma2", "Gemma2Config"), ("gpt_oss", "GptOssConfig"))]
#: the terms of each architecture's attention besides scale q.k and the causal mask
TERMS = {"gemma2": {"window": {"window": 0}, "softcap": {"softcap": 0.0}},
         "gpt_oss": {"window": {"window": 0}, "sinks": {"sinks": None}}}


@pytest.fixture(scope="module", params=ARCHITECTURES)
def tiny(request, tmp_path_factory):
    """(architecture, directory, codes file with every pair of layer 0 as sites and the compact store,
    transformers' eager output_attentions on the file's windows: per layer [N, H, T, T])."""
    architecture = request.param
    directory = save_tiny(tmp_path_factory.mktemp(architecture) / "model", architecture)
    out = directory.parent / "codes.h5"
    latentcode.extract(directory, task={"seq_len": SEQ_LEN}, sites="0:*:*", n=2, out=out, batch_size=2,
                       progress=False)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager",
                                                                  local_files_only=True).eval()
    ids = latentcode.CodeFile(out).extra("token_ids")
    with torch.no_grad():
        attentions = reference(input_ids=torch.as_tensor(ids), output_attentions=True).attentions
    return architecture, directory, out, [attention.numpy() for attention in attentions]


def rebuilt_without(path, layer: int, **dropped) -> np.ndarray:
    """Every row of `layer` rebuilt from the stored queries and keys with the stored mask, some of its
    terms replaced (`softcap=0`, `window=0`, `sinks=None`): `[N, H, T, T]`."""
    with h5py.File(path) as file:
        group = file["compact"]
        mask = LayerMask.from_attributes(group[query_name(layer)].attrs, "test")
        queries, keys = group[query_name(layer)][()], group[f"key_l{layer}"][()]
        key_valid = group["key_valid"][()].astype(bool)
    return rebuild_rows(queries, keys, np.arange(queries.shape[2]), key_valid, dataclasses.replace(mask, **dropped))


def test_eager_only_models_load_eagerly_and_run(tiny):
    architecture, directory, _, _ = tiny
    pretrained = latentcode.load_pretrained(directory, progress=False)
    assert pretrained.model.config._attn_implementation == "eager"
    assert pretrained.model.config.model_type == architecture
    with torch.no_grad():  # it runs, as transformers runs it
        assert pretrained.model(input_ids=torch.arange(16)[None]).logits.shape == (1, 16, VOCAB_SIZE)


def test_the_compact_store_rebuilds_eager_attention_exactly(tiny):
    architecture, _, out, reference = tiny
    codes = latentcode.CodeFile(out)
    assert codes.compact.layers == [0, 1] and (codes.compact.n_heads, codes.compact.n_kv_heads) == (4, 2)
    with h5py.File(out) as file:
        masks = [LayerMask.from_attributes(file["compact"][query_name(layer)].attrs, "test") for layer in (0, 1)]
    assert [mask.window for mask in masks] == [WINDOW, 0]  # read from each layer's own mask
    if architecture == "gemma2":
        assert [mask.softcap for mask in masks] == [5.0, 5.0] and masks[0].sinks is None
    else:
        assert masks[0].softcap == 0 and np.allclose(masks[0].sinks, np.linspace(-2.0, 3.0, 4), atol=1e-6)
    worst = 0.0
    for layer in (0, 1):
        rebuilt = np.stack([codes.compact.layer_pattern(layer, example) for example in range(2)])
        worst = max(worst, float(np.abs(rebuilt - reference[layer]).max()))
    print(f"{architecture}: largest |compact rebuild - eager output_attentions| over 2 layers x 2 windows x 4 heads "
          f"x {SEQ_LEN} x {SEQ_LEN}: {worst:.2e}")
    assert worst <= TOLERANCE


def test_the_sites_codes_equal_eager_attention(tiny):
    """The densely recorded sites (every pair of layer 0) are the model's probabilities too."""
    architecture, _, out, reference = tiny
    codes = latentcode.CodeFile(out)
    dense = np.zeros((2, 4, SEQ_LEN, SEQ_LEN), dtype=np.float32)
    for site in codes.sites:
        dense[:, :, site.query, site.key] = codes.codes(site)
    worst = float(np.abs(dense - reference[0]).max())
    print(f"{architecture}: largest |site codes - eager output_attentions| over layer 0: {worst:.2e}")
    assert len(codes.sites) == SEQ_LEN * SEQ_LEN and worst <= TOLERANCE


@pytest.mark.filterwarnings("ignore:.*contain NaN or inf:RuntimeWarning")  # masked pairs' scores are -inf
def test_scores_are_the_capped_masked_scores_whose_softmax_is_the_model(tiny):
    """score="scores": the scores after the cap and the mask (-inf where masked, at most the cap in size for
    Gemma 2); their softmax, with the sinks in the denominator for gpt-oss, is eager attention's."""
    architecture, directory, _, reference = tiny
    codes = latentcode.extract(directory, task={"seq_len": SEQ_LEN}, sites="0:*:*", n=2, score="scores",
                               batch_size=2, progress=False)
    scores = np.full((2, 4, SEQ_LEN, SEQ_LEN), np.nan, dtype=np.float32)
    for site in codes.sites:
        scores[:, :, site.query, site.key] = codes.codes(site)
    query, key = np.arange(SEQ_LEN)[:, None], np.arange(SEQ_LEN)[None, :]
    masked = (key > query) | (key <= query - WINDOW)  # layer 0 is a sliding-window layer
    assert np.isneginf(scores[..., masked]).all() and np.isfinite(scores[..., ~masked]).all()
    logits = torch.from_numpy(scores)
    if architecture == "gemma2":
        assert np.abs(scores[..., ~masked]).max() <= 5.0
        probabilities = torch.softmax(logits, dim=-1)
    else:
        sinks = torch.linspace(-2.0, 3.0, 4).reshape(1, 4, 1, 1).expand(2, 4, SEQ_LEN, 1)
        probabilities = torch.softmax(torch.cat([logits, sinks], dim=-1), dim=-1)[..., :-1]
    assert float((probabilities - torch.from_numpy(reference[0])).abs().max()) <= TOLERANCE


def test_dropping_a_term_from_the_rebuild_is_far_from_the_model(tiny):
    """Without the window (sliding layer 0), the soft cap (Gemma 2) or the sinks (gpt-oss) the rows are
    not the model's: the test above could not pass with that term ignored."""
    architecture, _, out, reference = tiny
    assert np.abs(rebuilt_without(out, 0) - reference[0]).max() <= TOLERANCE
    for term, dropped in TERMS[architecture].items():
        difference = float(np.abs(rebuilt_without(out, 0, **dropped) - reference[0]).max())
        print(f"{architecture}: without its {term}, the rebuild is off by {difference:.3f}")
        assert difference >= MATTERS, term


def test_rows_with_sinks_sum_to_less_than_one(tiny):
    """gpt-oss's sinks take their share of every row (most of it where a head's sink is large); Gemma 2's
    rows sum to 1."""
    architecture, _, out, reference = tiny
    sums = latentcode.CodeFile(out).compact.layer_pattern(1, 0).sum(axis=-1)  # [H, T]
    np.testing.assert_allclose(sums, reference[1][0].sum(axis=-1), atol=TOLERANCE)
    if architecture == "gpt_oss":
        assert sums.max() <= 1 + 1e-6 and sums.min() < 0.5
    else:
        np.testing.assert_allclose(sums, 1.0, atol=1e-5)


def test_an_eager_attention_with_a_term_latentcode_does_not_read_is_one_line(tiny, monkeypatch):
    """A model type whose eager attention adds a term (here a bias growing with the key position) is
    refused, naming the model type and the layer, and nothing is written."""
    architecture, directory, out, _ = tiny
    module = __import__(f"transformers.models.{architecture}.modeling_{architecture}", fromlist=["x"])
    original = module.eager_attention_forward

    def with_position_bias(attention, query, key, value, attention_mask, **kwargs):
        bias = torch.arange(key.shape[-2], dtype=query.dtype) * 0.5  # a bias growing with the key position
        return original(attention, query, key, value, attention_mask + bias, **kwargs)

    monkeypatch.setattr(module, "eager_attention_forward", with_position_bias)
    target = out.parent / "refused.h5"
    with pytest.raises(LatentcodeError) as raised:
        latentcode.extract(directory, task={"seq_len": SEQ_LEN}, n=1, out=target, progress=False)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{architecture} attention call 0 ")
    assert "its attention has a term latentcode does not read, so its codes are not recorded" in message
    assert not target.exists()


def test_a_tensor_the_eager_call_passes_unread_is_named():
    """What a refusal names: the tensors an eager function receives that the reading does not use (a
    model passing a position bias to its attention, as some do), not the ones that say where tokens are."""
    from latentcode.sources.eager_attention import eager_call

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, position_bias=None, **kwargs):
        raise AssertionError("not called")

    query, key = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 3, 8)
    call = eager_call(torch.nn.Linear(1, 1), eager_attention_forward, (query, key, key, None),
                      {"scaling": 0.5, "position_bias": torch.zeros(1, 4, 3, 3), "position_ids": torch.arange(3)})
    assert call["unread"] == ["position_bias"] and call["scale"] == 0.5 and call["sinks"] is None


def test_an_intervention_edits_the_eager_attention_as_the_model_would(tiny, monkeypatch):
    """Interventions read and edit these models at the same call: an edit that changes nothing changes no
    bit, and setting one code gives the logits of the model whose eager attention has that code (its own
    eager function, with the probability replaced before the value sum)."""
    from latentcode.intervention.edits import ScaleHeads, SetCode
    from latentcode.intervention.intervener import Intervention
    from latentcode.sources.detect import detect_source
    from latentcode.sources.torch_attention import TorchAttentionSource

    architecture, directory, out, _ = tiny
    model = latentcode.load_pretrained(directory, progress=False).model
    assert isinstance(detect_source(model), TorchAttentionSource)
    ids = torch.as_tensor(latentcode.CodeFile(out).extra("token_ids"))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with Intervention(model, ScaleHeads(factor=1.0), sites="0:20:15"):
            assert torch.equal(model(input_ids=ids).logits, plain)
        value = torch.tensor([0.9, 0.0, 0.5, 0.25])
        with Intervention(model, SetCode(value=value), sites="0:20:15"):
            edited = model(input_ids=ids).logits

        module = __import__(f"transformers.models.{architecture}.modeling_{architecture}", fromlist=["x"])
        original = module.eager_attention_forward

        def with_the_code_set(attention, query, key, value_states, attention_mask, **kwargs):
            output, weights = original(attention, query, key, value_states, attention_mask, **kwargs)
            if attention.layer_idx == 0:
                weights = weights.clone()
                weights[:, :, 20, 15] = value
                values = module.repeat_kv(value_states, attention.num_key_value_groups)
                output = torch.matmul(weights, values).transpose(1, 2).contiguous()
            return output, weights

        monkeypatch.setattr(module, "eager_attention_forward", with_the_code_set)
        reference = model(input_ids=ids).logits
    difference = float((edited - reference).abs().max())
    print(f"{architecture}: largest |intervened logits - reference| {difference:.2e}, moved by the edit "
          f"{float((reference - plain).abs().max()):.2e}")
    assert difference <= TOLERANCE and float((reference - plain).abs().max()) > 100 * TOLERANCE


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_extraction_runs_and_its_codes_are_near_the_models(tiny, dtype):
    """In half precision the codes are recomputed in float32 from the call's own queries and keys (as for
    SDPA calls), and the check runs the eager function on float32 copies of them, so nothing is refused
    for rounding; the model's own eager probabilities, rounded in half precision, agree within this
    model's rounding (its scores are large: a bfloat16 score moves its probability by more than 2^-8)."""
    architecture, directory, _, _ = tiny
    codes = latentcode.extract(directory, task={"seq_len": SEQ_LEN}, n=2, dtype=dtype, progress=False)
    assert codes.attrs["model_dtype"] == dtype
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager",
                                                              dtype=getattr(torch, dtype), local_files_only=True)
    with torch.no_grad():
        reference = model.eval()(input_ids=torch.as_tensor(codes.extra("token_ids")), output_attentions=True).attentions
    worst = max(float(np.abs(np.stack([codes.compact.layer_pattern(layer, example) for example in range(2)])
                             - reference[layer].float().numpy()).max()) for layer in (0, 1))
    print(f"{architecture}: largest |{dtype} compact rebuild - {dtype} eager output_attentions| {worst:.4f}")
    assert worst <= (0.15 if dtype == "bfloat16" else 0.02)


def test_a_model_whose_eager_attention_bypasses_the_registry_is_one_line(tiny, monkeypatch):
    """A layer that picks its eager function without transformers' registry makes no call latentcode reads
    (here layer 1 of every pass): refused in one line saying how many layers were read, not a compact
    store missing a layer."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    architecture, directory, out, _ = tiny
    module = __import__(f"transformers.models.{architecture}.modeling_{architecture}", fromlist=["x"])
    calls = []

    class EveryOtherLayer:
        def get_interface(self, name, default):
            calls.append(name)
            return ALL_ATTENTION_FUNCTIONS.get_interface(name, default) if len(calls) % 2 else default

    monkeypatch.setattr(module, "ALL_ATTENTION_FUNCTIONS", EveryOtherLayer())
    target = out.parent / "bypassed.h5"
    with pytest.raises(LatentcodeError) as raised:
        latentcode.extract(directory, task={"seq_len": SEQ_LEN}, sites="0:-1:-1", n=1, out=target, progress=False)
    message = str(raised.value)
    assert "\n" not in message and f"({architecture}, eager attention): 1 of its 2 layers made an attention call " \
        "latentcode reads" in message
    assert not target.exists()


def test_nested_recorders_both_read_every_eager_call(tiny):
    """Two captures at once (a Recorder inside another, as inside an Intervention) each see every call."""
    from latentcode.extraction.recorder import Recorder
    from latentcode.sources.torch_attention import TorchAttentionSource

    architecture, directory, out, reference = tiny
    model = latentcode.load_pretrained(directory, progress=False).model
    ids = torch.as_tensor(latentcode.CodeFile(out).extra("token_ids"))
    with torch.no_grad(), Recorder(model, "*:-1:*", source=TorchAttentionSource(model)) as outer, \
            Recorder(model, "1:-1:*", source=TorchAttentionSource(model)) as inner:
        model(input_ids=ids)
    outer_codes, inner_codes = outer.pop(), inner.pop()
    assert len(outer_codes) == 2 * SEQ_LEN and len(inner_codes) == SEQ_LEN
    for site, codes in inner_codes.items():
        np.testing.assert_array_equal(codes, outer_codes[site])
        np.testing.assert_allclose(codes, reference[1][:, :, -1, site.key], atol=TOLERANCE)
