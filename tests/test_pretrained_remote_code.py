"""A model directory that names code of its own (`auto_map` in config.json or tokenizer_config.json),
or a cache entry of a GGUF file that does, is refused in one line before transformers reads it: no
"[y/N]" prompt on a terminal, no traceback without one, from Python and from the command line, and
the named Python file never runs (it would write a marker)."""

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from latentcode.pretrained import PretrainedError, load_pretrained, load_tokenizer
from latentcode.safe_reads import sha256_of_file
from tests.pretrained_models import save_tiny_llama

ROOT = Path(__file__).resolve().parents[1]


def plant_remote_code(directory: Path, file_name: str, marker: Path) -> Path:
    """Give `directory` an auto_map in `file_name` naming a module that writes `marker` when imported."""
    code = f"open({str(marker)!r}, 'w').write('ran')\n"
    (directory / "configuration_evil.py").write_text(code + "from transformers import LlamaConfig as EvilConfig\n")
    (directory / "tokenization_evil.py").write_text(
        code + "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n")
    record = json.loads((directory / file_name).read_text())
    record["auto_map"] = ({"AutoConfig": "configuration_evil.EvilConfig"} if file_name == "config.json"
                          else {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    if file_name == "config.json":
        record["model_type"] = "evil"  # not a built-in type: transformers would need the directory's code
    (directory / file_name).write_text(json.dumps(record))
    return directory


def header_only_gguf(path: Path) -> Path:
    """A GGUF file of architecture llama whose header latentcode checks (`check_gguf`); never dequantised:
    the tests below read its cache entry."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def cache_entry_with_remote_code(tmp_path: Path, file_name: str, marker: Path) -> tuple[Path, Path]:
    """A `.gguf` file and a cache holding its entry (written by `write_entry` from a tiny Llama), whose
    `file_name` then got an auto_map, recorded in entry.json as if the entry had been written so (its
    sizes and SHA-256s agree: the cache's content check passes, only the auto_map refusal is left)."""
    import transformers

    from latentcode import pretrained_cache

    directory = save_tiny_llama(tmp_path / "source")
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    source, cache = header_only_gguf(tmp_path / "model.gguf"), tmp_path / "cache"
    entry, sha256 = pretrained_cache.entry_of(source, cache)
    pretrained_cache.write_entry(entry, sha256, source, model, tokenizer)
    plant_remote_code(entry, file_name, marker)
    record = json.loads((entry / pretrained_cache.ENTRY_FILE).read_text())
    names = sorted(name for name in os.listdir(entry) if name != pretrained_cache.ENTRY_FILE)
    record["files"] = {name: (entry / name).stat().st_size for name in names}
    record["sha256"] = {name: sha256_of_file(entry / name) for name in names}
    (entry / pretrained_cache.ENTRY_FILE).write_text(json.dumps(record))
    assert pretrained_cache.usable(entry, sha256)
    return source, cache


@pytest.fixture(params=["config.json", "tokenizer_config.json", "cache entry config.json",
                        "cache entry tokenizer_config.json"])
def remote_code_model(request, tmp_path):
    """(what to load, the file holding the auto_map, the marker its code would write, the cache to load with)"""
    marker, file_name = tmp_path / "marker", request.param.split()[-1]
    if request.param.startswith("cache entry"):
        source, cache = cache_entry_with_remote_code(tmp_path, file_name, marker)
        return source, file_name, marker, cache
    directory = save_tiny_llama(tmp_path / "model")
    return plant_remote_code(directory, file_name, marker), file_name, marker, tmp_path / "cache"


def test_an_auto_map_is_refused_in_process_and_its_code_never_runs(remote_code_model):
    path, file_name, marker, cache = remote_code_model
    for load in (load_pretrained, load_tokenizer):
        with pytest.raises(PretrainedError, match=rf"{file_name} has an auto_map \(Auto(Config|Tokenizer): .*evil"):
            load(path, cache=cache)
    assert not marker.exists()


SCRIPT = """
import sys
from latentcode.errors import LatentcodeError
from latentcode.pretrained import load_pretrained
try:
    load_pretrained(sys.argv[1])
except LatentcodeError as error:
    print("error:", error)
    sys.exit(2)
print("loaded")
"""


def run_on_a_terminal(arguments: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """Run `arguments` with stdin, stdout and stderr a pseudo-terminal; whatever it prints, and its
    exit status. Nothing is typed: a prompt would wait until the timeout."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(arguments, stdin=follower, stdout=follower, stderr=follower, cwd=ROOT, env=env,
                               close_fds=True)
    os.close(follower)
    output, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            output += chunk
        elif process.poll() is not None:
            break
    else:
        process.kill()
    os.close(leader)
    return process.wait(), output.decode(errors="replace")


def test_an_auto_map_is_one_line_without_a_prompt_on_a_terminal_and_without_one(remote_code_model, tmp_path):
    path, file_name, marker, cache = remote_code_model
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LATENTCODE_CACHE": str(cache)}
    out = tmp_path / "codes.h5"
    # load_pretrained in a script, and the command line's extract, whose plan reads the directory first
    for arguments in ([sys.executable, "-c", SCRIPT, str(path)],
                      [sys.executable, "-m", "latentcode.cli", "extract", str(path), "--n", "2", "--task", "seq_len=8",
                       "--out", str(out)]):
        status, output = run_on_a_terminal(arguments, env)
        lines = [line for line in output.splitlines() if line.strip()]
        assert status == 2, output
        assert len(lines) == 1 and lines[0].startswith("error: ") and f"{file_name} has an auto_map" in lines[0], output
        assert "[y/N]" not in output
        finished = subprocess.run(arguments, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=ROOT,
                                  env=env, timeout=300)
        printed = (finished.stdout + finished.stderr).splitlines()
        assert finished.returncode == 2 and len(printed) == 1 and f"{file_name} has an auto_map" in printed[0], printed
        assert "Traceback" not in finished.stderr
    assert not marker.exists() and not out.exists()
