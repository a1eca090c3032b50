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


def test_attribution_and_exact_ablation_of_the_strongest_head_agree_in_sign():
    half = 6
    tokens = repeated_random_tokens(2, half, vocab_size=64, seed=1, bos=1, low=2)
    model = tiny_llama("sdpa")
    attribution = induction_attribution(model, tokens, half, n_layers=2, n_heads=4)
    assert attribution.effects.shape == (2, 2, 4) and np.isfinite(attribution.effects).all()
    layer, head = attribution.top(1)[0]
    exact = ablation_effect(model, tokens, half, [(layer, head)], induction_pairs(half), attribution.base_loss)
    assert exact["n"] == 2 and exact["base_loss"] == pytest.approx(float(attribution.base_loss.mean()))
    # The first-order estimate and the exact change agree in sign for the strongest head of a random model.
    assert np.sign(exact["effect"]) == np.sign(attribution.mean()[layer, head])
    with pytest.raises(UsageError, match="at least one head"):
        ablation_effect(model, tokens, half, [], induction_pairs(half))


@pytest.mark.slow
def test_smollm2_demo_runs_and_writes_its_numbers(smollm2, tmp_path):
    from latentcode.relations.demo import run_smollm2_demo

    # The demo loads the model itself: from the cache the `smollm2` fixture filled.
    result = run_smollm2_demo(out=tmp_path / "demo", n_sequences=2, half=8, n_top=2, progress=False)
    assert (tmp_path / "demo" / "induction.json").is_file()
    assert (tmp_path / "demo" / "induction_attribution.png").is_file()
    assert len(result["top_heads"]) == 2 and np.isfinite(result["base_loss"])
