"""A cache of dequantised GGUF models: the float32 weights and the tokenizer of a `.gguf` file, kept
as a Hugging Face directory so the next load reads them instead of dequantising again (timings and
what is trusted: docs/how-to/long-context.md).

Where: `$LATENTCODE_CACHE/gguf/<file stem>-<first 16 hex digits of the file's SHA-256>/` (default
`~/.cache/latentcode`): `config.json` (without its GGUF quantization entry), `model.safetensors` (tied
weights once), the tokenizer's files and `entry.json`, written last, naming the source file, its SHA-256
and the size and SHA-256 of every file. An entry is used only where it is this user's own and intact
(`entry_problem`); else one warning line says why, and it is written anew (incomplete, damaged or edited)
or left alone (another user's, or a link). Every file goes through `latentcode.files.AtomicOutputs` under
the entry's lock, held by `filling` while one process dequantises, so processes loading one GGUF at once
dequantise it once. A cache that cannot be written is not an error: the model loads from the GGUF file and
a warning says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from latentcode.errors import LatentcodeError
from latentcode.safe_reads import sha256_of_file

CACHE_VARIABLE = "LATENTCODE_CACHE"
ENTRY_FILE = "entry.json"
# An entry without its files' SHA-256s ("sha256") is written anew; the format name stays, so that an
# earlier latentcode sharing the cache still reads the entries this one writes.
ENTRY_FORMAT = "latentcode-gguf-cache/1"
#: the files of an entry that a tokenizer alone reads (`load_tokenizer`), besides entry.json
TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja")
#: how long a process waits for another to fill the entry it needs (dequantising takes minutes when busy)
FILL_WAIT_SECONDS = 900


def entry_of(gguf_path: Path, root: str | Path | None = None) -> tuple[Path, str]:
    """The cache directory of a `.gguf` file (under `root`, default `$LATENTCODE_CACHE` or `~/.cache/latentcode`)
    and the file's SHA-256."""
    sha256 = sha256_of_file(gguf_path)
    root = Path(root or os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "latentcode")
    return root / "gguf" / f"{gguf_path.stem}-{sha256[:16]}", sha256


def usable(entry: Path, sha256: str, names: tuple[str, ...] | None = None) -> bool:
    """Whether `entry` is a complete entry of the file with this SHA-256, this user's own, every file
    (or those of `names`) of its recorded size and SHA-256 (see `entry_problem`)."""
    return entry_problem(entry, sha256, names) is None


def _own_plain(path: Path, kind: str) -> str | None:
    """Why `path` is not this user's own plain file (`kind` "file") or directory ("directory"), or None."""
    status = os.lstat(path)
    is_kind = stat.S_ISDIR if kind == "directory" else stat.S_ISREG
    if stat.S_ISLNK(status.st_mode):
        return f"{path} is a symbolic link"
    if not is_kind(status.st_mode):
        return f"{path} is not a {kind}"
    if hasattr(os, "getuid") and status.st_uid != os.getuid():
        return f"{path} belongs to user {status.st_uid}, not to this user ({os.getuid()})"
    if kind == "directory" and status.st_mode & 0o022:
        return f"{path} is writable by other users (mode {stat.S_IMODE(status.st_mode):o})"
    return None


def not_ours(entry: Path) -> str | None:
    """Why `entry` is not this user's own to use or to write, ending in "(not used)": a link, another
    user's directory or one writable by others, or a file in it that is a link or another user's;
    None where it is this user's own, or is not there. Reads no file's content."""
    try:
        os.lstat(entry)
    except (FileNotFoundError, NotADirectoryError):  # not there (or a file where a folder of its path is)
        return None
    except OSError as error:
        return f"{entry} cannot be read ({error}) (not used)"
    try:
        foreign = _own_plain(entry, "directory")
        for name in [] if foreign else sorted(os.listdir(entry)):
            foreign = foreign or (None if name.startswith(".") else _own_plain(entry / name, "file"))
    except FileNotFoundError:
        return None  # gone meanwhile: nothing of another user's to leave alone
    except OSError as error:
        return f"{entry} cannot be read ({error}) (not used)"
    return f"{foreign} (not used)" if foreign else None


def entry_problem(entry: Path, sha256: str, names: tuple[str, ...] | None = None) -> str | None:
    """None where `entry` can be used; "" where there is no entry (nothing to say); else why not, in
    words ending in what is done: "... (written anew)" for an incomplete, damaged or edited entry of
    this user, "... (not used)" for another user's entry or a link, which this process leaves alone.
    `names`: check only these files (and that every recorded one is there at its size)."""
    entry = Path(entry)
    foreign = not_ours(entry)
    if foreign:
        return foreign
    if not os.path.lexists(entry / ENTRY_FILE):
        return ""  # no entry, or a directory without its record (an interrupted fill): written without a word
    try:
        record = json.loads((entry / ENTRY_FILE).read_text())
        if record.get("format") != ENTRY_FORMAT:
            return f"{entry} is of format {record.get('format')!r}, not {ENTRY_FORMAT} (written anew)"
        if record.get("source_sha256") != sha256:
            return (f"{entry} is of a file of SHA-256 {str(record.get('source_sha256'))[:12]}, "
                    f"not {sha256[:12]} (written anew)")
        if "sha256" not in record:
            return f"{entry} records no SHA-256 of its files (an earlier latentcode wrote it) (written anew)"
        sizes, digests = dict(record["files"]), dict(record["sha256"])
        present = {name for name in os.listdir(entry) if not name.startswith(".")} - {ENTRY_FILE}
        if present != set(sizes) or set(digests) != set(sizes):
            extra, missing = sorted(present - set(sizes)), sorted(set(sizes) - present)
            return f"{entry} holds {extra or 'no'} files beyond its record and lacks {missing or 'none'} (written anew)"
        for name, size in sizes.items():  # each this user's own plain file (not_ours above)
            if (entry / name).stat().st_size != size:
                return (f"{entry / name} is {(entry / name).stat().st_size} bytes, "
                        f"not the {size} recorded (written anew)")
        for name in sizes if names is None else [name for name in sizes if name in names]:
            if sha256_of_file(entry / name) != digests[name]:
                return (f"{entry / name} has changed since it was written: "
                        "its SHA-256 differs from the one recorded (written anew)")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{entry} is not a readable entry ({' '.join(str(error).split())[:120]}) (written anew)"
    return None


@contextlib.contextmanager
def filling(entry: Path, sha256: str) -> Iterator[bool]:
    """Hold `entry`'s lock while this process fills it: yields True where the entry is usable (now, or
    once another process holding the lock has written it: read it), False where this process is to
    dequantise and `write_entry` (which then joins this lock; its files are renamed on leaving).
    A lock that cannot be taken (a read-only cache, or another process filling it for longer than
    FILL_WAIT_SECONDS) yields False with a warning: the model loads without the cache's help."""
    from latentcode.files import AtomicOutputs

    problem = entry_problem(entry, sha256)
    if problem is None:
        yield True
        return
    if problem:
        warnings.warn(f"the cached dequantised model is not used: {problem}", stacklevel=3)
    if problem.endswith("(not used)"):  # another user's entry, or a link: leave it alone
        yield False
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
    join its set and are renamed when it is left. An entry that is not this user's own (`not_ours`: a
    link, another user's; `filling` has said so) is left alone: nothing is written, not even its lock."""
    from latentcode.files import AtomicOutputs
    from latentcode.models.persistence import save_safetensors

    if not_ours(entry):
        return

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
            weights_file = outputs.temporary(entry / "model.safetensors")
            save_safetensors(weights, weights_file, metadata={"format": "pt"})
            sizes = {name: len(data) for name, data in files.items()}
            sizes["model.safetensors"] = os.path.getsize(weights_file)
            digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
            digests["model.safetensors"] = sha256_of_file(weights_file)
            outputs.write_text(entry / ENTRY_FILE, json.dumps(
                {"format": ENTRY_FORMAT, "source": str(source), "source_sha256": sha256, "files": sizes,
                 "sha256": digests}, indent=1))
    except (OSError, LatentcodeError) as error:
        warnings.warn(f"the dequantised model of {source} was not cached in {entry} ({error}); the next load "
                      f"dequantises it again (set {CACHE_VARIABLE} to a writable directory to keep it)", stacklevel=3)
