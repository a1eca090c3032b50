"""Causal LMs that transformers runs only with eager attention (issue 47 item 4, in part): a tiny random
Gemma 2 (soft-capped scores, sliding window) and gpt-oss (attention sinks) saved with a tokenizer load
(`load_pretrained` no longer forces SDPA), run as transformers runs them, and an extraction, which reads
SDPA calls only, is refused in one line instead of a traceback."""

from __future__ import annotations

import pytest
import torch
import transformers

import latentcode
from latentcode.errors import LatentcodeError
from tests.pretrained_models import VOCAB_SIZE, tiny_tokenizer

SMALL = dict(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


def save_tiny(directory, architecture: str):
    torch.manual_seed(0)
    if architecture == "gemma2":
        config = transformers.Gemma2Config(**SMALL, sliding_window=8, attn_logit_softcapping=50.0,
                                           final_logit_softcapping=30.0, architectures=["Gemma2ForCausalLM"])
        model = transformers.Gemma2ForCausalLM(config)
    else:
        config = transformers.GptOssConfig(**SMALL, sliding_window=8, num_local_experts=2, num_experts_per_tok=1,
                                           layer_types=["sliding_attention", "full_attention"],
                                           architectures=["GptOssForCausalLM"])
        model = transformers.GptOssForCausalLM(config)
    model.eval().save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


@pytest.mark.parametrize("architecture", ["gemma2", "gpt_oss"])
def test_an_eager_only_model_loads_and_its_extraction_is_one_line(tmp_path, architecture):
    directory = save_tiny(tmp_path / architecture, architecture)
    pretrained = latentcode.load_pretrained(directory, progress=False)
    assert pretrained.model.config._attn_implementation == "eager"
    with torch.no_grad():  # it runs, as transformers runs it
        assert pretrained.model(input_ids=torch.arange(16)[None]).logits.shape == (1, 16, VOCAB_SIZE)
    with pytest.raises(LatentcodeError, match=rf"{architecture} runs only with 'eager' attention, not through "
                                              "scaled_dot_product_attention") as raised:
        latentcode.extract(directory, task={"seq_len": 16}, n=1, progress=False)
    assert "\n" not in str(raised.value)
