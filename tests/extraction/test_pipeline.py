"""extract(): a trained run's codes on task instances, into HDF5; atomic, appendable."""

import hashlib

import numpy as np
import pytest
import torch

import latentcode
from latentcode.store import CodeFile, CodeFileError, Site
from latentcode.tasks import eval_seed
from latentcode.tasks.sraven import SRaven
from latentcode.training import build_train_config, train


@pytest.fixture(scope="module")
def sraven_run(tmp_path_factory):
    config = build_train_config("sraven", "tiny", "hyla", n_layers=2, d_model=32, d_mlp=32, n_train_instances=4 * 128)
    return train(config, tmp_path_factory.mktemp("runs") / "sraven", progress=False)


def test_extract_records_codes_labels_predictions_and_provenance(sraven_run, tmp_path):
    out = latentcode.extract(sraven_run.path, sites="sraven-rule", split="ood", n=300, out=tmp_path / "codes.h5",
                             batch_size=128, progress=False)
    codes = CodeFile(out)
    assert len(codes) == 300 and codes.splits == ["ood"]
    assert codes.sites == [Site(0, 35, 27), Site(0, 35, 31), Site(1, 35, 27), Site(1, 35, 31)]
    weights = sraven_run.path / "model" / "model.safetensors"
    assert codes.attrs["checkpoint_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert codes.model_config["attention"] == "hyla" and codes.task_config["name"] == "sraven"
    assert codes.selector["variant"] == "unpermuted" and codes.attrs["seed"] == str(eval_seed("ood"))
    assert codes.split_descriptions == SRaven.split_descriptions, "what each split holds, for titles and reports"

    # The same instances, regenerated, give the same codes through the model's own cache.
    task, model = sraven_run.task(), sraven_run.load_model()
    batches = [task.sample(size, "ood", seed=(eval_seed("ood"), index), variant="unpermuted")
               for index, size in enumerate((128, 128, 44))]
    x = torch.from_numpy(np.concatenate([b.x for b in batches]))
    output, cache = model.run_with_cache(x)
    for site in codes.sites:
        expected = cache[f"blocks.{site.layer}.attn.hook_pattern"][:, :, site.query, site.key].numpy()
        np.testing.assert_allclose(codes.codes(site), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(codes.prediction(), output[:, -4:].detach().numpy(), rtol=1e-5, atol=1e-6)
    query_rule = np.concatenate([b.labels["query_rule"] for b in batches])
    np.testing.assert_array_equal(codes.labels("query_rule"), query_rule)
    np.testing.assert_array_equal(codes.labels("rule"), query_rule[:, -1], err_msg="the rule of the last query token")
    np.testing.assert_array_equal(codes.target(), np.concatenate([b.y for b in batches]))


def test_killed_extraction_leaves_no_file_and_keeps_the_previous(sraven_run, tmp_path, monkeypatch):
    from latentcode.tasks.sraven import SRaven

    out = tmp_path / "codes.h5"
    real_sample = SRaven.sample

    def dies_on_the_third_batch(self, n, split="train", seed=0, variant=None):
        if isinstance(seed, tuple) and seed[1] == 2:
            raise KeyboardInterrupt
        return real_sample(self, n, split, seed, variant)

    monkeypatch.setattr(SRaven, "sample", dies_on_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        latentcode.extract(sraven_run.path, split="ood", n=400, out=out, batch_size=100, progress=False)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(SRaven, "sample", real_sample)
    latentcode.extract(sraven_run.path, split="ood", n=100, out=out, batch_size=100, progress=False)
    before = out.read_bytes()
    monkeypatch.setattr(SRaven, "sample", dies_on_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        latentcode.extract(sraven_run.path, split="train", n=400, out=out, batch_size=100, append=True, progress=False)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["codes.h5"]


def test_append_and_schema_mismatch(sraven_run, tmp_path):
    out = tmp_path / "codes.h5"
    latentcode.extract(sraven_run.path, split="ood", n=50, out=out, batch_size=64, progress=False)
    latentcode.extract(sraven_run.path, split="test", n=30, out=out, batch_size=64, append=True, progress=False)
    codes = CodeFile(out)
    assert len(codes) == 80 and codes.splits == ["ood", "test"] and codes.codes(codes.sites[0], "test").shape == (30, 4)  # tiny SRAVEN: 4 heads
    with pytest.raises(CodeFileError, match="sites differ"):
        latentcode.extract(sraven_run.path, sites="0:-1:-1", split="test", n=10, out=out, append=True, progress=False)
    with pytest.raises(FileExistsError, match="already exists; pass append=True"):
        latentcode.extract(sraven_run.path, split="test", n=10, out=out, progress=False)
    assert len(CodeFile(out)) == 80


def test_extract_cli(sraven_run, tmp_path, capsys):
    from latentcode.cli import main

    assert main(["extract", str(sraven_run.path), "--split", "ood", "--n", "64", "--sites", "sraven-rule",
                 "--out", str(tmp_path / "c.h5"), "--quiet"]) == 0
    assert "wrote" in capsys.readouterr().out and len(CodeFile(tmp_path / "c.h5")) == 64
    assert main(["extract", str(tmp_path / "nothing"), "--out", str(tmp_path / "d.h5")]) == 2
    assert "neither a finished run directory" in capsys.readouterr().err
    # A misspelt split is refused before any progress bar or file appears.
    assert main(["extract", str(sraven_run.path), "--split", "odd", "--out", str(tmp_path / "e.h5")]) == 2
    captured = capsys.readouterr()
    assert "unknown split 'odd' for task 'sraven'; valid splits: ['train', 'test', 'ood']" in captured.err
    assert "extract odd" not in captured.err and not (tmp_path / "e.h5").exists()


def test_extract_cli_says_the_work_then_a_line_per_step_in_a_log_and_nothing_when_quiet(sraven_run, tmp_path, capsys):
    """stderr under pytest is no terminal, as in a log: the work is announced, then plain lines (no bar's
    carriage returns) up to the last batch; --quiet prints no progress at all."""
    from latentcode.cli import main

    assert main(["extract", str(sraven_run.path), "--split", "ood", "--n", "40", "--batch-size", "16",
                 "--sites", "sraven-rule", "--out", str(tmp_path / "c.h5")]) == 0
    err = capsys.readouterr().err
    assert "extract ood: 40 instances (unpermuted) in 3 batches of up to 16 sequences of 36, 4 sites x 4 heads" in err
    assert "extract ood: 1/3 batches" in err and "extract ood: 3/3 batches" in err and "\r" not in err
    assert main(["extract", str(sraven_run.path), "--split", "ood", "--n", "40", "--batch-size", "16",
                 "--sites", "sraven-rule", "--out", str(tmp_path / "d.h5"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
