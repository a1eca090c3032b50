"""Small transformer-lens 4.x TransformerBridges around Hugging Face models built from configs (no download),
shared by the extraction and intervention tests."""

import torch

BATCH, LENGTH, VOCAB = 2, 6, 99


def hf_bridge(kind, tokenizer):
    import transformer_lens
    import transformers

    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=VOCAB
        )
        model = transformers.BertForMaskedLM(config)
    else:
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=16)
        model = transformers.GPT2LMHeadModel(config)
    return transformer_lens.TransformerBridge.boot_transformers(kind, hf_model=model.eval(), tokenizer=tokenizer)


def tokens():
    return torch.randint(5, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1))




def word_tokenizer(directory):
    """A word-level BERT tokenizer written to `directory` and loaded back (a bridge needs name_or_path)."""
    import transformers

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]
    (directory / "vocab.txt").write_text("\n".join(vocab))
    transformers.BertTokenizerFast(vocab_file=str(directory / "vocab.txt")).save_pretrained(directory)
    return transformers.AutoTokenizer.from_pretrained(directory)
