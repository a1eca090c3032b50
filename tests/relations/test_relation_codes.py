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


def second_copy_loss_with_scaled_codes(model, tokens, half, heads, scale, monkeypatch, pairs=None):
    """Per sequence, the mean next-token cross-entropy at the queries half + 1 .. 2 half - 1 with the
    codes of every (layer, head) of `heads` at `pairs` (query, key; default the induction pairs
    (q, q - half + 1)) multiplied by `scale`: Llama's eager attention written out here
    (softmax(q k^T * scaling + mask) v), none of latentcode's code."""
    from transformers.models.llama import modeling_llama

    if pairs is None:
        pairs = [(query, query - half + 1) for query in range(half + 1, 2 * half)]
    queries, keys = [query for query, _ in pairs], [key for _, key in pairs]

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key = key.repeat_interleave(module.num_key_value_groups, dim=1)  # grouped-query heads
        value = value.repeat_interleave(module.num_key_value_groups, dim=1)
        scores = query @ key.transpose(2, 3) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, : key.shape[-2]]
        weights = torch.softmax(scores, dim=-1)
        scaled = [head for layer, head in heads if layer == module.layer_idx]
        if scaled:
            weights = weights.clone()
            for head in scaled:
                weights[:, head, queries, keys] *= scale
        return (weights @ value).transpose(1, 2).contiguous(), weights

    implementation = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with monkeypatch.context() as patch, torch.no_grad():
            patch.setattr(modeling_llama, "eager_attention_forward", attention)
            logits = model(torch.as_tensor(tokens)).logits[:, half + 1:2 * half]
    finally:
        model.config._attn_implementation = implementation
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
    base = second_copy_loss_with_scaled_codes(reference, tokens, half, [], 1.0, monkeypatch)
    attribution = induction_attribution(model, tokens, half, n_layers=2, n_heads=4)
    assert attribution.effects.shape == (2, 2, 4)
    np.testing.assert_allclose(attribution.base_loss, base, rtol=1e-5)
    changes = np.zeros((2, 4))
    for layer in range(2):
        for head in range(4):
            exact = ablation_effect(model, tokens, half, [(layer, head)], induction_pairs(half), attribution.base_loss)
            ablated = second_copy_loss_with_scaled_codes(reference, tokens, half, [(layer, head)], 0.0, monkeypatch)
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
            down = second_copy_loss_with_scaled_codes(reference, tokens, half, [(layer, head)], 1 - step, monkeypatch)
            up = second_copy_loss_with_scaled_codes(reference, tokens, half, [(layer, head)], 1 + step, monkeypatch)
            by_differences[:, layer, head] = (down - up) / (2 * step)
    np.testing.assert_allclose(attribution.effects, by_differences, rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_smollm2_demo_writes_the_losses_of_a_hand_written_attention(smollm2, tmp_path, monkeypatch):
    """The demo's numbers on SmolLM2, recomputed here on the same sequences through the hand-written
    eager attention: the base loss, each top head's exact ablation at the induction pairs, the top
    heads together there and at the random pairs of the control (float32 on both sides: 3e-6 nats
    apart seen, on effects of 0.006 to 3 nats; 2e-5 allowed); the top heads listed by decreasing
    attribution, the figure and the table written."""
    import json

    from latentcode.relations.demo import run_smollm2_demo

    n_sequences, half, n_top = 2, 8, 2
    # The demo loads the model itself: from the cache the `smollm2` fixture filled.
    result = run_smollm2_demo(out=tmp_path / "demo", n_sequences=n_sequences, half=half, n_top=n_top, progress=False)
    assert json.loads((tmp_path / "demo" / "induction.json").read_text())["top_heads"] == result["top_heads"]
    assert (tmp_path / "demo" / "induction_attribution.png").stat().st_size > 0

    tokenizer, model = smollm2.tokenizer, smollm2.model
    tokens = repeated_random_tokens(n_sequences, half, len(tokenizer), 0, tokenizer.bos_token_id,
                                    low=max(tokenizer.all_special_ids) + 1)  # the demo's sequences (seed 0)

    def change(heads, pairs=None):
        return float((second_copy_loss_with_scaled_codes(model, tokens, half, heads, 0.0, monkeypatch, pairs)
                      - base).mean())

    base = second_copy_loss_with_scaled_codes(model, tokens, half, [], 1.0, monkeypatch)
    assert result["base_loss"] == pytest.approx(base.mean(), rel=1e-5)
    top = [(row["layer"], row["head"]) for row in result["top_heads"]]
    assert len(top) == n_top
    attributions = [row["attribution"] for row in result["top_heads"]]
    assert attributions == sorted(attributions, reverse=True)
    for row, head in zip(result["top_heads"], top, strict=True):
        assert row["n"] == n_sequences and row["effect"] == pytest.approx(change([head]), rel=1e-4, abs=2e-5), head
    assert result["top_heads_at_induction_pairs"]["effect"] == pytest.approx(change(top), rel=1e-4, abs=2e-5)
    control = change(top, random_pairs(half, 0))
    assert result["top_heads_at_random_pairs"]["effect"] == pytest.approx(control, rel=1e-4, abs=2e-5)
