"""One extraction loop for every model (issue 47 item 1): a latentcode model (the shipped fuzzy-logic softmax
model) and a causal LM (a tiny random Llama) are recorded by the same `run_extraction` loop, batch by
batch through `record_batch`, and their codes equal an independent computation: the model's own cache of
patterns, and transformers' eager `output_attentions` on the windows the file stores. The compact store is
an option: refused in one line for a latentcode model, left out of a causal LM's file on request."""

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import latentcode
from latentcode.cli import main
from latentcode.extraction import pipeline, plan_extract
from latentcode.store import CodeFile
from latentcode.tasks import eval_seed
from tests.pretrained_models import save_tiny_llama

MODEL = Path(__file__).resolve().parents[2] / "models" / "fuzzy_logic-softmax"
SEQ_LEN = 24


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "tiny")


def test_a_trained_model_and_a_causal_lm_are_recorded_by_one_loop(tiny_llama, tmp_path, monkeypatch):
    seen = []
    record_batch = pipeline.record_batch

    def spy(loaded, x, kept, *args, **kwargs):
        seen.append(type(loaded.model).__name__)
        return record_batch(loaded, x, kept, *args, **kwargs)

    monkeypatch.setattr(pipeline, "record_batch", spy)
    trained = CodeFile(latentcode.extract(MODEL, sites="*:-1:*", n=20, batch_size=8, out=tmp_path / "trained.h5",
                                          progress=False))
    llama = CodeFile(latentcode.extract(tiny_llama, {"seq_len": SEQ_LEN}, "*:-1:*", n=3, batch_size=2,
                                        out=tmp_path / "llama.h5", progress=False))
    assert seen == ["Transformer"] * 3 + ["LlamaForCausalLM"] * 2  # 20 in batches of 8; 3 windows in batches of 2

    # The latentcode model: its own cache of patterns on the same instances, drawn again from the task
    plan = plan_extract(MODEL, sites="*:-1:*", n=20, batch_size=8)
    task, model = plan.inputs.task, latentcode.load_model(MODEL / "model")
    x = np.concatenate([task.sample(size, plan.split, seed=(eval_seed(plan.split), index), variant=plan.variant).x
                        for index, size in enumerate((8, 8, 4))])
    _, cache = model.eval().run_with_cache(torch.from_numpy(x))
    assert len(trained.sites) == 2 * task.seq_len
    for site in trained.sites:
        expected = cache[f"blocks.{site.layer}.attn.hook_pattern"][:, :, site.query, site.key].numpy()
        np.testing.assert_allclose(trained.codes(site), expected, rtol=1e-5, atol=1e-6)

    # The causal LM: transformers' eager attention on the windows the file stores
    eager = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, attn_implementation="eager",
                                                              local_files_only=True).eval()
    with torch.no_grad():
        attentions = eager(input_ids=torch.as_tensor(llama.extra("token_ids")), output_attentions=True).attentions
    assert len(llama.sites) == 2 * SEQ_LEN and llama.extra("token_ids").shape == (3, SEQ_LEN)
    worst = max(float(np.abs(llama.codes(site) - attentions[site.layer][:, :, site.query, site.key].numpy()).max())
                for site in llama.sites)
    assert worst <= 1e-5
    assert llama.compact.layers == [0, 1] and trained.compact is None


def test_the_compact_store_is_an_option(tiny_llama, tmp_path, capsys):
    out = tmp_path / "codes.h5"
    assert main(["extract", str(MODEL), "--n", "4", "--compact", "--out", str(out), "--quiet"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: compact=True (--compact): ") and "is a latentcode model" in error
    assert "\n" not in error and not out.exists()
    assert main(["extract", str(tiny_llama), "--task", "seq_len=16", "--n", "2", "--no-compact", "--out", str(out),
                 "--quiet"]) == 0
    assert CodeFile(out).compact is None and CodeFile(out).attrs["compact"] == "{}"


def test_a_loaded_pretrained_model_is_extracted_as_its_directory_is(tiny_llama):
    """`extract` takes a loaded `Pretrained` (what `extract_pretrained(model=...)` took): the same codes,
    windows and labels as from the directory, in memory."""
    from_directory = latentcode.extract(tiny_llama, {"seq_len": 16}, "*:-1:*", n=2, progress=False)
    from_object = latentcode.extract(latentcode.load_pretrained(tiny_llama, progress=False), {"seq_len": 16},
                                     "*:-1:*", n=2, progress=False)
    assert from_object.sites == from_directory.sites and len(from_object.sites) == 2 * 16
    for site in from_directory.sites:
        np.testing.assert_array_equal(from_object.codes(site), from_directory.codes(site))
    np.testing.assert_array_equal(from_object.extra("token_ids"), from_directory.extra("token_ids"))
    np.testing.assert_array_equal(from_object.labels("last_token_class"), from_directory.labels("last_token_class"))
    assert from_object.attrs["checkpoint_sha256"] == from_directory.attrs["checkpoint_sha256"]
