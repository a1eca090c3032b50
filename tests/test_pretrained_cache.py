"""latentcode.pretrained_cache: an entry holds the same tensors and tokenizer as the model it was
written from (tied weights once), is used only when complete and of the same source file, and a cache
that cannot be written is a warning, not an error. (The real GGUF round trip is the slow SmolLM2 test
in test_pretrained.py.)"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import transformers

from latentcode import pretrained_cache
from tests.pretrained_models import save_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = save_tiny_llama(tmp_path_factory.mktemp("tiny"), tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return model, tokenizer


@pytest.fixture()
def source(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"not really a gguf file, only its bytes are hashed")
    return path


def test_an_entry_holds_the_same_tensors_and_tokenizer(tiny, source, tmp_path):
    model, tokenizer = tiny
    entry, sha256 = pretrained_cache.entry_of(source, tmp_path / "cache")
    assert entry.name == f"model-{sha256[:16]}" and len(sha256) == 64
    assert not pretrained_cache.usable(entry, sha256)
    pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)
    assert pretrained_cache.usable(entry, sha256)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(entry, local_files_only=True).eval()
    first, second = model.state_dict(), reloaded.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    # Tied weights are stored once and tied again on load.
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    text = "In the beginning God created the heaven and the earth."
    assert transformers.AutoTokenizer.from_pretrained(entry, local_files_only=True)(text).input_ids == \
        tokenizer(text).input_ids
    assert "quantization_config" not in json.loads((entry / "config.json").read_text())


def test_an_entry_of_another_file_or_a_damaged_entry_is_not_used(tiny, source, tmp_path):
    model, tokenizer = tiny
    entry, sha256 = pretrained_cache.entry_of(source, tmp_path / "cache")
    pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)
    assert not pretrained_cache.usable(entry, "0" * 64)  # another source file
    weights = entry / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated
    assert not pretrained_cache.usable(entry, sha256)
    pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)  # written anew
    assert pretrained_cache.usable(entry, sha256)
    (entry / "entry.json").write_text("{")  # not JSON
    assert not pretrained_cache.usable(entry, sha256)
    (entry / "entry.json").unlink()
    assert not pretrained_cache.usable(entry, sha256)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_cache_that_cannot_be_written_warns_and_leaves_nothing(tiny, source, tmp_path):
    model, tokenizer = tiny
    root = tmp_path / "read-only"
    root.mkdir()
    root.chmod(0o500)
    try:
        entry, sha256 = pretrained_cache.entry_of(source, root)
        with pytest.warns(UserWarning, match="was not cached"):
            pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)
        assert not pretrained_cache.usable(entry, sha256)
    finally:
        root.chmod(0o700)


def test_a_cache_on_a_file_warns_instead_of_failing_the_load(tiny, source, tmp_path):
    model, tokenizer = tiny
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way of the cache directory")
    entry, sha256 = pretrained_cache.entry_of(source, blocker)
    with pytest.warns(UserWarning, match="was not cached"):
        pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)
    assert blocker.read_text() == "in the way of the cache directory"


def test_the_cache_root_is_the_environment_variable_or_the_home_cache(source, monkeypatch, tmp_path):
    def root():
        entry, sha256 = pretrained_cache.entry_of(source)
        assert entry.name == f"model-{sha256[:16]}" and entry.parent.name == "gguf"
        return entry.parent.parent

    monkeypatch.setenv("LATENTCODE_CACHE", str(tmp_path))
    assert root() == tmp_path
    monkeypatch.delenv("LATENTCODE_CACHE")
    assert root() == pretrained_cache.Path.home() / ".cache" / "latentcode"


def test_a_cache_given_as_text_is_a_directory(source, tmp_path):
    entry, sha256 = pretrained_cache.entry_of(source, str(tmp_path))
    assert entry == tmp_path / "gguf" / f"model-{sha256[:16]}"



def test_two_loaders_at_once_fill_the_entry_once(tiny, source, tmp_path):
    # What the ranks of a torchrun launch do: both find no entry; one fills it, the other waits and
    # reads it. Two threads: the entry's lock excludes two holders in one process as across processes.
    model, tokenizer = tiny
    entry, sha256 = pretrained_cache.entry_of(source, tmp_path / "cache")
    both_started, results = threading.Barrier(2), []

    def load() -> None:
        both_started.wait()
        with pretrained_cache.filling(entry, sha256) as cached:
            if not cached:  # dequantising, slowly: the other must wait for it, not fill the entry too
                time.sleep(1)
                pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)
        results.append(("cached" if cached else "filled", pretrained_cache.usable(entry, sha256)))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(results) == [("cached", True), ("filled", True)]
    assert not [name for name in os.listdir(entry) if name.startswith(".")]  # no temporaries left


# The last 16 float32 weights of a safetensors file overwritten, at the same size and with the same header
SAME_SIZE_EDITS = {"zeroed": bytes(64), "nan": b"\x00\x00\xc0\x7f" * 16}


def edit_at_the_same_size(weights, edit: str) -> None:
    data = bytearray(weights.read_bytes())
    data[-64:] = SAME_SIZE_EDITS[edit]
    weights.write_bytes(bytes(data))


@pytest.mark.parametrize("edit", sorted(SAME_SIZE_EDITS))
def test_an_entry_edited_at_the_same_size_is_not_used_and_is_written_anew(tiny, source, tmp_path, edit):
    model, tokenizer = tiny
    entry, sha256 = pretrained_cache.entry_of(source, tmp_path / "cache")
    pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)
    weights = entry / "model.safetensors"
    size = weights.stat().st_size
    edit_at_the_same_size(weights, edit)
    assert weights.stat().st_size == size
    assert not pretrained_cache.usable(entry, sha256)
    assert pretrained_cache.usable(entry, sha256, names=pretrained_cache.TOKENIZER_FILES)  # the tokenizer is intact
    with pytest.warns(UserWarning, match=r"model.safetensors has changed since it was written.*\(written anew\)"):
        with pretrained_cache.filling(entry, sha256) as cached:
            assert not cached
            pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)
    assert pretrained_cache.usable(entry, sha256)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(entry, local_files_only=True)
    assert all(torch.equal(tensor, reloaded.state_dict()[name]) for name, tensor in model.state_dict().items())
    (entry / "tokenizer.json").write_text((entry / "tokenizer.json").read_text().replace('"', "'", 1))
    assert not pretrained_cache.usable(entry, sha256, names=pretrained_cache.TOKENIZER_FILES)


def test_an_entry_with_a_file_beyond_its_record_or_without_digests_is_written_anew(tiny, source, tmp_path):
    model, tokenizer = tiny
    entry, sha256 = pretrained_cache.entry_of(source, tmp_path / "cache")
    pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)
    (entry / "model.safetensors.index.json").write_text("{}")  # transformers would read it
    assert "beyond its record" in pretrained_cache.entry_problem(entry, sha256)
    (entry / "model.safetensors.index.json").unlink()
    record = json.loads((entry / "entry.json").read_text())
    del record["sha256"]
    (entry / "entry.json").write_text(json.dumps(record))
    assert "records no SHA-256 of its files" in pretrained_cache.entry_problem(entry, sha256)
    (entry / "entry.json").write_text(json.dumps({**record, "format": "latentcode-gguf-cache/0"}))
    assert "is of format 'latentcode-gguf-cache/0'" in pretrained_cache.entry_problem(entry, sha256)


def test_another_users_entry_or_a_link_is_not_used_nor_written(tiny, source, tmp_path, monkeypatch):
    model, tokenizer = tiny
    entry, sha256 = pretrained_cache.entry_of(source, tmp_path / "cache")
    pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)
    before = {name: (entry / name).read_bytes() for name in os.listdir(entry)}

    def files(directory):
        return {name: ((directory / name).read_bytes(), os.lstat(directory / name).st_ino)
                for name in os.listdir(directory)}

    def refused(path, reason: str) -> None:
        assert not pretrained_cache.usable(path, sha256)
        inside, beside = files(entry), sorted(os.listdir(entry.parent))
        with pytest.warns(UserWarning, match=reason + r".*\(not used\)"):
            with pretrained_cache.filling(path, sha256) as cached:
                assert not cached
                # what load_pretrained then does: dequantise, and write the entry, which is left alone
                pretrained_cache.write_entry(path, sha256, source, model, tokenizer)
        assert files(entry) == inside, "the entry (or the link's target) was written"
        assert sorted(os.listdir(entry.parent)) == beside  # no lock nor entry beside it

    # An entry of another user (the owner seen as another uid), or writable by others.
    real_uid = os.getuid()
    monkeypatch.setattr(pretrained_cache.os, "getuid", lambda: real_uid + 1)
    refused(entry, f"belongs to user {real_uid}, not to this user")
    monkeypatch.undo()
    entry.chmod(0o777)
    refused(entry, "is writable by other users")
    entry.chmod(0o755)
    # The entry reached through a link, or one file of it a link to a file elsewhere.
    link = entry.with_name(entry.name + "-link")
    link.symlink_to(entry, target_is_directory=True)
    refused(link, "is a symbolic link")
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(before["config.json"])
    (entry / "config.json").unlink()
    (entry / "config.json").symlink_to(elsewhere)
    refused(entry, "config.json is a symbolic link")
    assert elsewhere.read_bytes() == before["config.json"]


def test_the_command_line_prints_a_warning_on_one_line(tmp_path):
    # A cache entry not used, or a cache not written, is a warning (the command goes on): the command line
    # prints it as `warning: ...`, one line, not Python's `file:line: UserWarning: ...` and a source line.
    script = (
        "import dataclasses, sys, warnings\n"
        "import latentcode.cli.tasks as tasks\n"
        "def run(args):\n"
        "    warnings.warn('the cached dequantised model is not used: x is a symbolic link (not used)')\n"
        "    warnings.warn('a second warning\\nwith a newline', RuntimeWarning)\n"
        "tasks.COMMAND = dataclasses.replace(tasks.COMMAND, run=run)\n"
        "from latentcode.cli import main\n"
        "sys.exit(main(['tasks', 'ambiguity']))\n")
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert finished.returncode == 0, finished.stderr
    assert finished.stderr.splitlines() == [
        "warning: the cached dequantised model is not used: x is a symbolic link (not used)",
        "warning: RuntimeWarning: a second warning\\nwith a newline"], finished.stderr


def copy_of_the_session_entry(tmp_path: Path) -> tuple[Path, Path, str]:
    """A copy, in a cache of this test, of the SmolLM2 entry the session's `smollm2` fixture wrote."""
    from latentcode.pretrained import smollm2_path

    session_entry, sha256 = pretrained_cache.entry_of(smollm2_path())
    assert pretrained_cache.usable(session_entry, sha256)
    cache = tmp_path / "cache"
    entry = cache / "gguf" / session_entry.name
    entry.mkdir(parents=True)
    for name in os.listdir(session_entry):
        shutil.copyfile(session_entry / name, entry / name)
    return cache, entry, sha256


def extract_smollm2(cache: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "latentcode.cli", "extract", "smollm2", "--task", "seq_len=16", "--n",
                           "2", "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "LATENTCODE_CACHE": str(cache),
                               "PYTHONPATH": str(Path(__file__).resolve().parents[1])})


def cache_warnings(stderr: str) -> list[str]:
    assert "Traceback" not in stderr and "UserWarning" not in stderr, stderr
    return [line for line in stderr.splitlines() if "cached dequantised model" in line]


@pytest.mark.slow
def test_smollm2_with_nan_weights_edited_into_its_entry_is_rebuilt_with_one_line(smollm2, tmp_path):
    # The case: the dequantised entry's model.safetensors edited at the same size (NaN) was used
    # without a word, and codes differed in 59 of 61 compact datasets.
    cache, entry, sha256 = copy_of_the_session_entry(tmp_path)
    intact = (entry / "model.safetensors").read_bytes()
    edit_at_the_same_size(entry / "model.safetensors", "nan")
    finished = extract_smollm2(cache, tmp_path / "codes.h5")
    assert finished.returncode == 0, finished.stderr[-3000:]
    lines = cache_warnings(finished.stderr)
    assert len(lines) == 1 and lines[0].startswith("warning: the cached dequantised model is not used: "), lines
    assert "model.safetensors has changed since it was written" in lines[0] and lines[0].endswith("(written anew)")
    assert pretrained_cache.usable(entry, sha256) and (entry / "model.safetensors").read_bytes() == intact
    assert (tmp_path / "codes.h5").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("whose", ["another user's", "a link"])
def test_smollm2_from_another_users_entry_or_a_link_dequantises_and_leaves_it_alone(smollm2, tmp_path, whose):
    cache, entry, sha256 = copy_of_the_session_entry(tmp_path)
    if whose == "a link":
        target = tmp_path / "elsewhere"
        entry.rename(target)
        entry.symlink_to(target, target_is_directory=True)
        reason = f"{entry} is a symbolic link (not used)"
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the entry to another user")
        other = os.getuid() + 4242
        for path in (entry, *entry.iterdir()):
            os.chown(path, other, other)
        reason = f"{entry} belongs to user {other}, not to this user ({os.getuid()}) (not used)"
    before = {path.name: (path.read_bytes(), path.lstat().st_uid) for path in entry.iterdir()}
    finished = extract_smollm2(cache, tmp_path / "codes.h5")
    assert finished.returncode == 0, finished.stderr[-3000:]
    lines = cache_warnings(finished.stderr)
    assert lines == [f"warning: the cached dequantised model is not used: {reason}"], lines
    assert {path.name: (path.read_bytes(), path.lstat().st_uid) for path in entry.iterdir()} == before
    assert sorted(os.listdir(cache / "gguf")) == [entry.name]  # nothing written beside it
    assert (tmp_path / "codes.h5").is_file()
