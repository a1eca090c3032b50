"""A model directory that names code of its own (`auto_map` in config.json or tokenizer_config.json)
is refused in one line before transformers reads it: no "[y/N]" prompt on a terminal, no traceback
without one, and the named Python file never runs (it would write a marker)."""

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


@pytest.fixture(params=["config.json", "tokenizer_config.json"])
def remote_code_model(request, tmp_path):
    directory = save_tiny_llama(tmp_path / "model")
    return plant_remote_code(directory, request.param, tmp_path / "marker"), request.param, tmp_path / "marker"


def test_an_auto_map_is_refused_in_process_and_its_code_never_runs(remote_code_model):
    directory, file_name, marker = remote_code_model
    for load in (load_pretrained, load_tokenizer):
        with pytest.raises(PretrainedError, match=rf"{file_name} has an auto_map \(Auto(Config|Tokenizer): .*evil"):
            load(directory)
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


def run_on_a_terminal(arguments: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run `arguments` with stdin, stdout and stderr a pseudo-terminal; whatever it prints, and its
    exit status. Nothing is typed: a prompt would wait until the timeout."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(arguments, stdin=follower, stdout=follower, stderr=follower, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, close_fds=True)
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


def test_an_auto_map_is_one_line_without_a_prompt_on_a_terminal_and_without_one(remote_code_model):
    directory, file_name, marker = remote_code_model
    status, output = run_on_a_terminal([sys.executable, "-c", SCRIPT, str(directory)])
    lines = [line for line in output.splitlines() if line.strip()]
    assert status == 2, output
    assert len(lines) == 1 and lines[0].startswith("error: ") and "auto_map" in lines[0], output
    assert "[y/N]" not in output
    finished = subprocess.run([sys.executable, "-c", SCRIPT, str(directory)], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              timeout=120)
    assert finished.returncode == 2 and finished.stdout.count("\n") == 1 and "auto_map" in finished.stdout
    assert "Traceback" not in finished.stderr
    assert not marker.exists()
