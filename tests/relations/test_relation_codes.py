"""The codes at labelled pairs, the induction pairs and their ablation, on a tiny Llama built from a
config (random weights, nothing downloaded); the real SmolLM2 in the slow test."""

import numpy as np
import pytest
import torch

from latentcode.analysis.token_relations import RELATIONS, relations_of
from latentcode.errors import UsageError
from latentcode.relations import relation_codes
from latentcode.relations.induction import (
    ablation_effect,
    induction_attribution,
    induction_pairs,
    random_pairs,
)
from latentcode.tasks.token_sequences import repeated_random_tokens

transformers = pytest.importorskip("transformers")


def tiny_llama(implementation: str):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.config._attn_implementation = implementation
    return model.eval()


def test_codes_at_pairs_are_the_attention_probabilities_of_eager_attention():
    tokens = repeated_random_tokens(3, 8, vocab_size=64, seed=0, bos=1, low=2)
    model = tiny_llama("sdpa")
    pairs = relation_codes(model, tokens, range(9, 17), per_relation=3, seed=0, batch_size=2)
    eager = tiny_llama("eager")  # the same seed: the same weights
    with torch.no_grad():
        attentions = eager(torch.as_tensor(tokens), output_attentions=True).attentions  # per layer [B, H, T, T]
    expected = np.stack([attention.numpy()[pairs.sequence, :, pairs.query, pairs.key] for attention in attentions],
                        axis=1)
    np.testing.assert_allclose(pairs.codes, expected, atol=1e-5)
    labels = relations_of(tokens[0], pairs.query[pairs.sequence == 0], pairs.key[pairs.sequence == 0])
    assert labels.relation.tolist() == pairs.relation[pairs.sequence == 0].tolist()
    assert set(pairs.relation.tolist()) == set(range(len(RELATIONS)))


def test_induction_pairs_are_labelled_induction_and_random_pairs_are_not():
    half = 7
    tokens = repeated_random_tokens(1, half, vocab_size=64, seed=0, low=2)[0]
    queries, keys = np.array(induction_pairs(half)).T
    assert queries.tolist() == list(range(half + 1, 2 * half))
    assert set(relations_of(tokens, queries, keys).names()) == {"induction"}
    random_queries, random_keys = np.array(random_pairs(half, seed=3)).T
    assert random_queries.tolist() == queries.tolist()
    assert ((random_keys != keys) & (random_keys <= random_queries) & (random_keys >= 0)).all()


def second_copy_loss_with_scaled_codes(model, tokens, half, layer, head, scale, monkeypatch):
    """Per sequence, the mean next-token cross-entropy at the queries half + 1 .. 2 half - 1 with the
    codes of (layer, head) at the induction pairs (q, q - half + 1) multiplied by `scale`: Llama's
    eager attention written out here (softmax(q k^T * scaling + mask) v), none of latentcode's code."""
    from transformers.models.llama import modeling_llama

    queries = list(range(half + 1, 2 * half))
    keys = [query - half + 1 for query in queries]

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key = key.repeat_interleave(module.num_key_value_groups, dim=1)  # grouped-query heads
        value = value.repeat_interleave(module.num_key_value_groups, dim=1)
        scores = query @ key.transpose(2, 3) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        weights = torch.softmax(scores, dim=-1)
        if module.layer_idx == layer:
            weights = weights.clone()
            weights[:, head, queries, keys] *= scale
        return (weights @ value).transpose(1, 2).contiguous(), weights

    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr(modeling_llama, "eager_attention_forward", attention)
        logits = model(torch.as_tensor(tokens)).logits[:, half + 1:2 * half]
    targets = torch.as_tensor(tokens)[:, half + 2:]
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(dim=1).numpy()


def test_the_exact_ablation_of_every_head_equals_a_hand_written_attention(monkeypatch):
    """ablation_effect's exact loss change of zeroing (layer, head)'s codes at the induction pairs
    equals the change computed through a hand-written eager attention (scale 0), for every head;
    attribution's estimate agrees in sign for the strongest head."""
    half = 6
    tokens = repeated_random_tokens(2, half, vocab_size=64, seed=1, bos=1, low=2)
    model = tiny_llama("sdpa")
    reference = tiny_llama("eager").double()  # the same seed: the same weights
    base = second_copy_loss_with_scaled_codes(reference, tokens, half, 0, 0, 1.0, monkeypatch)
    attribution = induction_attribution(model, tokens, half, n_layers=2, n_heads=4)
    assert attribution.effects.shape == (2, 2, 4)
    np.testing.assert_allclose(attribution.base_loss, base, rtol=1e-5)
    changes = np.zeros((2, 4))
    for layer in range(2):
        for head in range(4):
            exact = ablation_effect(model, tokens, half, [(layer, head)], induction_pairs(half), attribution.base_loss)
            ablated = second_copy_loss_with_scaled_codes(reference, tokens, half, layer, head, 0.0, monkeypatch)
            changes[layer, head] = (ablated - base).mean()
            assert exact["n"] == 2 and exact["base_loss"] == pytest.approx(base.mean(), rel=1e-5)
            assert exact["effect"] == pytest.approx(changes[layer, head], rel=1e-3, abs=1e-6), (layer, head)
    assert np.abs(changes).max() > 1e-3  # the heads matter
    layer, head = attribution.top(1)[0]
    assert np.sign(changes[layer, head]) == np.sign(attribution.mean()[layer, head])
    with pytest.raises(UsageError, match="at least one head"):
        ablation_effect(model, tokens, half, [], induction_pairs(half))


@pytest.mark.xfail(strict=True, reason="issue 52 finding, not yet explained: attribution differs from the float64 "
                   "central-difference derivative by up to 7% (layer 1 head 0, sequence 0: 0.0011394 against "
                   "0.0011131), while the base losses agree to 1e-7")
def test_attribution_is_the_derivative_of_the_ablation_for_every_head(monkeypatch):
    """Attribution's first-order estimate of zeroing (layer, head)'s codes at the induction pairs is
    d/dt loss(codes * (1 - t)) at t = 0: here by central differences (float64, t = +-1e-4) through the
    hand-written eager attention, for every head and sequence."""
    half = 6
    tokens = repeated_random_tokens(2, half, vocab_size=64, seed=1, bos=1, low=2)
    attribution = induction_attribution(tiny_llama("sdpa"), tokens, half, n_layers=2, n_heads=4)
    reference = tiny_llama("eager").double()
    step = 1e-4
    by_differences = np.zeros((2, 2, 4))
    for layer in range(2):
        for head in range(4):
            down = second_copy_loss_with_scaled_codes(reference, tokens, half, layer, head, 1 - step, monkeypatch)
            up = second_copy_loss_with_scaled_codes(reference, tokens, half, layer, head, 1 + step, monkeypatch)
            by_differences[:, layer, head] = (down - up) / (2 * step)
    np.testing.assert_allclose(attribution.effects, by_differences, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_smollm2_demo_runs_and_writes_its_numbers(smollm2, tmp_path):
    from latentcode.relations.demo import run_smollm2_demo

    # The demo loads the model itself: from the cache the `smollm2` fixture filled.
    result = run_smollm2_demo(out=tmp_path / "demo", n_sequences=2, half=8, n_top=2, progress=False)
    assert (tmp_path / "demo" / "induction.json").is_file()
    assert (tmp_path / "demo" / "induction_attribution.png").is_file()
    assert len(result["top_heads"]) == 2 and np.isfinite(result["base_loss"])
