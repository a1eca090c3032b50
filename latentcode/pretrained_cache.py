"""A cache of dequantised GGUF models: the float32 weights and the tokenizer of a `.gguf` file, kept
as a Hugging Face directory so the next load reads them instead of dequantising again.

    load_pretrained("smollm2")       # first time: GGUF -> float32 (37 s on a quiet core, minutes when busy)
                                     # then: from the cache (6 s), the same tensors bit for bit

Where: `$LATENTCODE_CACHE/gguf/<file stem>-<first 16 hex digits of the file's SHA-256>/`, with
`$LATENTCODE_CACHE` defaulting to `~/.cache/latentcode`. One entry holds `config.json` (the model's
config without its GGUF quantization entry), `model.safetensors` (tied weights once), the tokenizer's
files and `entry.json`, written last, naming the source file, its SHA-256 and the size of every file.
An entry is used only when `entry.json` is there and every file has its recorded size; anything else
(a half-copied or damaged entry) is ignored and written anew. Every file goes through
`latentcode.files.AtomicOutputs` under the entry's lock, so two processes filling the same entry do
not mix their files; and `filling` holds that lock while one process dequantises, so that processes
loading the same GGUF at once (the ranks of a torchrun launch) dequantise it once: the others wait,
then read the entry it wrote. A cache that cannot be written (read-only home, full disk) is not an error: the
model loads from the GGUF file as before and a warning says why it was not kept.
A SmolLM2-135M entry takes about 540 MB.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from latentcode.errors import LatentcodeError

CACHE_VARIABLE = "LATENTCODE_CACHE"
ENTRY_FILE = "entry.json"
ENTRY_FORMAT = "latentcode-gguf-cache/1"
#: how long a process waits for another to fill the entry it needs (dequantising takes minutes when busy)
FILL_WAIT_SECONDS = 900


def cache_root() -> Path:
    """`$LATENTCODE_CACHE`, or `~/.cache/latentcode`."""
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "latentcode")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def entry_of(gguf_path: Path, root: str | Path | None = None) -> tuple[Path, str]:
    """The cache directory of a `.gguf` file and the file's SHA-256."""
    sha256 = file_sha256(gguf_path)
    return (Path(root) if root else cache_root()) / "gguf" / f"{gguf_path.stem}-{sha256[:16]}", sha256


def usable(entry: Path, sha256: str) -> bool:
    """Whether `entry` is a complete entry of the file with this SHA-256 (every file at its recorded size)."""
    try:
        record = json.loads((entry / ENTRY_FILE).read_text())
        return (record.get("format") == ENTRY_FORMAT and record.get("source_sha256") == sha256
                and all((entry / name).stat().st_size == size for name, size in record["files"].items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


@contextlib.contextmanager
def filling(entry: Path, sha256: str) -> Iterator[bool]:
    """Hold `entry`'s lock while this process fills it: yields True where the entry is usable (now, or
    once another process holding the lock has written it: read it), False where this process is to
    dequantise and `write_entry` (which then joins this lock; its files are renamed on leaving).
    A lock that cannot be taken (a read-only cache, or another process filling it for longer than
    FILL_WAIT_SECONDS) yields False with a warning: the model loads without the cache's help."""
    from latentcode.files import AtomicOutputs

    if usable(entry, sha256):
        yield True
        return
    outputs = AtomicOutputs(lock=entry, wait=FILL_WAIT_SECONDS, purpose="caching a dequantised model")
    try:
        outputs.__enter__()
    except (OSError, LatentcodeError) as error:
        warnings.warn(f"cannot lock the cache entry {entry} ({error}); dequantising without it", stacklevel=3)
        yield False
        return
    try:
        yield usable(entry, sha256)
    except BaseException as error:
        outputs.__exit__(type(error), error, error.__traceback__)
        raise
    try:
        outputs.__exit__(None, None, None)
    except (OSError, LatentcodeError) as error:
        warnings.warn(f"the dequantised model was not cached in {entry} ({error}); the next load dequantises it "
                      f"again (set {CACHE_VARIABLE} to a writable directory to keep it)", stacklevel=3)


def write_entry(entry: Path, sha256: str, source: Path, model: Any, tokenizer: Any) -> None:
    """Write `model`'s float32 weights, config and `tokenizer` as the entry `entry`, all or none;
    a warning (not an error) where the cache cannot be written. Inside `filling(entry, ...)` the files
    join its set and are renamed when it is left."""
    from latentcode.files import AtomicOutputs
    from latentcode.models.persistence import save_safetensors

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    weights = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()
               if not (tied and name == "lm_head.weight")}
    try:
        with tempfile.TemporaryDirectory() as scratch, AtomicOutputs(lock=entry, wait=600,
                                                                     purpose="caching a dequantised model") as outputs:
            tokenizer.save_pretrained(scratch)
            files = {name: (Path(scratch) / name).read_bytes() for name in sorted(os.listdir(scratch))}
            files["config.json"] = json.dumps(config, indent=1, sort_keys=True).encode()
            for name, data in files.items():
                outputs.write_bytes(entry / name, data)
            save_safetensors(weights, outputs.temporary(entry / "model.safetensors"), metadata={"format": "pt"})
            sizes = {name: len(data) for name, data in files.items()}
            sizes["model.safetensors"] = os.path.getsize(outputs.temporary(entry / "model.safetensors"))
            outputs.write_text(entry / ENTRY_FILE, json.dumps(
                {"format": ENTRY_FORMAT, "source": str(source), "source_sha256": sha256, "files": sizes}, indent=1))
    except (OSError, LatentcodeError) as error:
        warnings.warn(f"the dequantised model of {source} was not cached in {entry} ({error}); the next load "
                      f"dequantises it again (set {CACHE_VARIABLE} to a writable directory to keep it)", stacklevel=3)
