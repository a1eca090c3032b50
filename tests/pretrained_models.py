"""A tiny random Llama-style causal LM (GQA, RoPE) saved as a local Hugging Face directory with a
byte-level BPE tokenizer trained on a few lines of the corpus: what `load_pretrained` reads from
disk, built offline in a second."""

from pathlib import Path

import torch
import transformers

VOCAB_SIZE = 300


def tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    from tokenizers import ByteLevelBPETokenizer

    from latentcode.tasks.corpus import corpus_split

    bpe = ByteLevelBPETokenizer()
    text = bytes(corpus_split("train")[:20_000]).decode("ascii")
    bpe.train_from_iterator(text.splitlines(), vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=None)


def tiny_llama_config(**overrides) -> transformers.LlamaConfig:
    settings = dict(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                    rope_theta=10_000.0, architectures=["LlamaForCausalLM"])
    settings.update(overrides)
    return transformers.LlamaConfig(**settings)


def save_tiny_llama(directory: Path, seed: int = 0, **overrides) -> Path:
    """A random LlamaForCausalLM (4 query heads, 2 key/value heads) and its tokenizer in `directory`."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(tiny_llama_config(**overrides)).eval()
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return Path(directory)
