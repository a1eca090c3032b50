"""Exact query-key attribution (issue 48): the terms sum to the score the model itself computes, on our
three attention kinds (LayerNorm, biases, relative and rotary positions), a tiny random Hugging Face
Llama with GQA and RoPE (biases on and off) and a transformer-lens 4.x bridge; models whose scores are
not bilinear are refused in one line. References come from the models' own hooks (our
`hook_attn_scores`; HF's q_proj/k_proj outputs rotated by HF's own `apply_rotary_pos_emb`; the bridge's
`hook_q`/`hook_k`), never from the decomposition's code.

Figures seen (float32, max |sum of terms - score| / max |score| over all pairs, layer 2 of 3): our
models 2.4e-7 to 5.9e-7 (softmax, linear, HYLA; relative and rotary), the tiny Llama 3.3e-7 (4.4e-7 with
biases), the bridge 5.1e-7; the tests hold them to 1e-5."""

import pytest
import torch

from latentcode.intervention.qk import CannotDecompose, decompose, read_head
from latentcode.models import ModelConfig, build_model

TOLERANCE = 1e-5


def all_pairs(n_positions, causal=True):
    return torch.tensor([(q, k) for q in range(n_positions) for k in range(n_positions) if k <= q or not causal])


def randomised(model, seed=0):
    """Every parameter drawn at random (biases, gains and offsets included, not their zero/one init)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5 + (parameter == 1).float())
    return model.eval()


def relative_error(total, reference):
    return float((total - reference).abs().max() / reference.abs().max())


@pytest.mark.parametrize("attention", ["softmax", "linear", "hyla"])
@pytest.mark.parametrize("positions", ["relative", "rotary"])
def test_terms_sum_to_our_models_scores(attention, positions):
    config = ModelConfig(n_layers=3, d_model=24, n_heads=3, kqv_dim=12, d_mlp=32, attention=attention,
                         positions=positions, n_ctx=8, causal=False, d_in=5, d_out=4, attn_dropout=0.0)
    model = randomised(build_model(config, seed=0))
    tokens = torch.randn(1, 7, 5, generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(tokens)
    pairs = all_pairs(7, causal=False)
    for layer, head in [(0, 1), (2, 0), (2, 2)]:
        reading, _ = read_head(model, tokens, layer, head)
        terms = decompose(reading, pairs)
        reference = cache[f"blocks.{layer}.attn.hook_attn_scores"][0, head][pairs[:, 0], pairs[:, 1]]
        assert relative_error(terms.total, reference) < TOLERANCE
        expected_names = 2 + layer * 4 + (1 if positions == "relative" else 0)
        assert len(terms.names) == expected_names and terms.names[-1] == "bias"
        assert (layer == 0) or "L1.H2" in terms.names and "L0.mlp" in terms.names
        # marginals: the query side summed over keys and the key side summed over queries give the same total
        assert torch.allclose(terms.query_marginal.sum(1), terms.key_marginal.sum(1), atol=1e-5)


def tiny_llama(**overrides):
    transformers = pytest.importorskip("transformers")
    from tests.pretrained_models import tiny_llama_config

    torch.manual_seed(0)
    config = tiny_llama_config(num_hidden_layers=3, attn_implementation="sdpa", **overrides)
    model = transformers.LlamaForCausalLM(config)
    return randomised(model) if overrides.get("attention_bias") else model.eval()


def hf_reference_scores(model, tokens, layer, head):
    """q . k * scaling from the layer's q_proj/k_proj outputs, rotated by transformers' own RoPE code."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attention = model.model.layers[layer].self_attn
    captured = {}
    handles = [attention.q_proj.register_forward_hook(lambda m, i, o: captured.update(q=o)),
               attention.k_proj.register_forward_hook(lambda m, i, o: captured.update(k=o)),
               model.model.rotary_emb.register_forward_hook(lambda m, i, o: captured.update(cos=o[0], sin=o[1]))]
    with torch.no_grad():
        model(tokens)
    for handle in handles:
        handle.remove()
    d_head, n_positions = attention.head_dim, tokens.shape[1]
    q = captured["q"].view(1, n_positions, -1, d_head).transpose(1, 2)
    k = captured["k"].view(1, n_positions, -1, d_head).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, captured["cos"], captured["sin"])
    group = q.shape[1] // k.shape[1]
    return q[0, head] @ k[0, head // group].T * attention.scaling


@pytest.mark.parametrize("attention_bias", [False, True])
def test_terms_sum_to_a_tiny_llamas_scores_with_gqa_and_rope(attention_bias):
    model = tiny_llama(attention_bias=attention_bias)
    tokens = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(2))
    pairs = all_pairs(12)
    for layer, head in [(0, 0), (2, 1), (2, 3)]:  # GQA: heads 0, 1 share key/value head 0; 2, 3 head 1
        terms = decompose(read_head(model, tokens, layer, head)[0], pairs)
        reference = hf_reference_scores(model, tokens, layer, head)[pairs[:, 0], pairs[:, 1]]
        assert relative_error(terms.total, reference) < TOLERANCE
        assert relative_error(terms.scores, reference) < TOLERANCE
    assert terms.names[:3] == ["embed", "L0.H0", "L0.H1"] and "position" not in terms.names


def test_terms_sum_to_a_transformer_lens_bridges_scores():
    transformer_lens = pytest.importorskip("transformer_lens")
    if not hasattr(transformer_lens, "TransformerBridge"):
        pytest.skip("transformer-lens < 4 has no TransformerBridge")
    config = transformer_lens.TransformerBridgeConfig(d_model=32, d_head=8, n_layers=3, n_ctx=16, n_heads=4,
                                                      d_vocab=99, seed=0)
    bridge = transformer_lens.TransformerBridge.boot_native(config)
    randomised(bridge)
    tokens = torch.randint(0, 99, (1, 10), generator=torch.Generator().manual_seed(3))
    _, cache = bridge.run_with_cache(tokens)
    pairs = all_pairs(10)
    for layer, head in [(0, 2), (2, 1)]:
        terms = decompose(read_head(bridge, tokens, layer, head)[0], pairs)
        q = cache[f"blocks.{layer}.attn.hook_q"][0, :, head]
        k = cache[f"blocks.{layer}.attn.hook_k"][0, :, head]
        reference = (q @ k.T / 8 ** 0.5)[pairs[:, 0], pairs[:, 1]]
        assert relative_error(terms.total, reference) < TOLERANCE
    assert terms.names[:3] == ["embed", "position", "L0.H0"]


def test_a_soft_capped_model_is_refused_in_one_line():
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma2Config(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                       attn_logit_softcapping=50.0)
    model = transformers.Gemma2ForCausalLM(config).eval()
    with pytest.raises(CannotDecompose, match="soft-caps") as error:
        read_head(model, torch.arange(5)[None], 0, 0)
    assert "\n" not in str(error.value) and "tanh is not linear" in str(error.value)


def test_layer_and_head_out_of_range_are_refused_in_one_line():
    model = tiny_llama()
    for layer, head, word in [(3, 0, "layer must be an integer in 0..2"), (0, 4, "head must be an integer in 0..3")]:
        with pytest.raises(CannotDecompose, match=word):
            read_head(model, torch.arange(5)[None], layer, head)
