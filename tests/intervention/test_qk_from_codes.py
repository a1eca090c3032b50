"""`qk_from_codes`: the query-key terms of a compact store's codes, the components recovered by running the
model again on the stored token ids, after checking that its queries and keys are the stored ones. The
reference: the queries/keys latentcode.extract stored (the attention call's own inputs, after RoPE) and the
terms from a direct `qk_attribution` on the same tokens."""

import h5py
import numpy as np
import pytest
import torch
import transformers

import latentcode
from latentcode.intervention.qk import CannotDecompose, qk_attribution, qk_from_codes
from latentcode.store import CodeFile
from tests.pretrained_models import save_tiny_llama


@pytest.fixture(scope="module")
def compact_file(tmp_path_factory):
    directory = save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    out = tmp_path_factory.mktemp("codes") / "tiny.h5"
    latentcode.extract(directory, {"seq_len": 24}, "*:-1:-1", split="validation", n=2, out=out, batch_size=2,
                       progress=False)
    return directory, out


def test_terms_of_a_compact_store_equal_a_direct_attribution(compact_file):
    directory, path = compact_file
    terms = qk_from_codes(path, layer=1, head=3, pairs="previous", example=1)
    assert terms.stored_gap < 1e-5  # the recomputed queries/keys are the stored ones
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    tokens = CodeFile(path).extra("token_ids")[1]
    direct = qk_attribution(model, tokens, 1, 3, "previous")
    assert torch.allclose(terms.terms, direct.terms, atol=1e-6)
    with h5py.File(path) as file:  # the score from the stored queries and keys, not the model's
        queries, keys = file["compact/query_l1"][1, 3], file["compact/key_l1"][1, 3 // 2]
    stored_scores = (queries[1:] * keys[:-1]).sum(-1) / np.sqrt(queries.shape[-1])
    assert np.abs(terms.total.numpy() - stored_scores).max() < 1e-5 * np.abs(stored_scores).max()


def test_another_model_is_refused_in_one_line(compact_file, tmp_path):
    _, path = compact_file
    other = transformers.AutoModelForCausalLM.from_pretrained(save_tiny_llama(tmp_path / "other", seed=1),
                                                              local_files_only=True).eval()
    with pytest.raises(CannotDecompose, match="differ from those .* stores by") as refused:
        qk_from_codes(path, layer=1, head=0, model=other)
    assert "\n" not in str(refused.value)
    with pytest.raises(CannotDecompose, match="compact layers"):
        qk_from_codes(path, layer=7, head=0)


def test_the_command_decomposes_a_codes_file(compact_file, tmp_path):
    """`latentcode qk CODES.h5 --example I`: the table's score is the stored queries' and keys' score."""
    import subprocess
    import sys

    import pandas as pd

    _, path = compact_file
    cli = [sys.executable, "-c", "import sys; from latentcode.cli import main; sys.exit(main(sys.argv[1:]))"]
    done = subprocess.run([*cli, "qk", str(path), "--example", "1", "--layer", "1",
                           "--head", "2", "--pairs", "5:0..5", "--out", str(tmp_path / "qk")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(tmp_path / "qk" / "qk.csv")
    with h5py.File(path) as file:
        queries, keys = file["compact/query_l1"][1, 2], file["compact/key_l1"][1, 2 // 2]
    stored = (queries[5] * keys[:6]).sum(-1) / np.sqrt(queries.shape[-1])
    assert abs(table.loc[table["kind"] == "score", "mean"].item() - stored.mean()) < 1e-5 * np.abs(stored).max()
    bad = subprocess.run([*cli, "qk", str(path), "--repeat", "--layer", "1", "--head", "2",
                          "--pairs", "previous", "--out", str(tmp_path / "bad")], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--example" in bad.stderr
