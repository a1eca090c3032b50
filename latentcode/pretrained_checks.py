"""What a pretrained model's files say about it, read and checked without torch or transformers, so
that a file that cannot be loaded is one line before anything heavy starts:

    gguf_metadata(path)          # a .gguf header: its scalar fields, after checking every count and
                                 # length against the file's size, and its tensors lie inside the file
    check_model_directory(path)  # a Hugging Face directory: config.json an object with positive head and
                                 # layer counts, safetensors weights (no pickle), no auto_map

The GGUF header is parsed here rather than with `gguf.GGUFReader`, which on a truncated file loops
for minutes over strings read past its end, and on absurd counts raises IndexError or tries to
allocate them. Standard library only.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

from latentcode.errors import LatentcodeError

#: a config.json or tokenizer_config.json larger than this is not read (a model's are kilobytes)
MAX_CONFIG_BYTES = 64 << 20
# The files in which transformers looks for an `auto_map` (classes to import from the directory's own code).
REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")
# GGUF value types: struct format of the fixed-size ones; 8 is a string, 9 an array.
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class PretrainedError(LatentcodeError):
    """A pretrained model that cannot be loaded as a causal language model; says what and why."""


class _Header:
    """A bounded reader over the bytes of a GGUF file: every read past the end is a PretrainedError."""

    def __init__(self, path: Path, data: Any):
        self.path, self.data, self.position = path, data, 0

    def take(self, size: int, what: str) -> int:
        if size < 0 or self.position + size > len(self.data):
            raise PretrainedError(f"{self.path} is truncated or damaged: {what} needs {size} bytes at byte "
                                  f"{self.position} of {len(self.data)}; expected a complete .gguf model file")
        start, self.position = self.position, self.position + size
        return start

    def scalar(self, kind: int, what: str) -> Any:
        fmt = _GGUF_SCALARS[kind]
        return struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, least_bytes_each: int) -> int:
        number = self.scalar(10, what)
        if number * least_bytes_each > len(self.data) - self.position:
            raise PretrainedError(f"{self.path} declares {number} {what}, more than its {len(self.data)} bytes can "
                                  "hold; expected a complete, undamaged .gguf model file")
        return number

    def string(self, what: str) -> str:
        length = self.count(f"bytes of {what}", 1)
        start = self.take(length, what)
        return bytes(self.data[start:start + length]).decode("utf-8", errors="replace")

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        if kind in _GGUF_SCALARS:
            return self.scalar(kind, what)
        if kind == _GGUF_STRING:
            return self.string(what)
        if kind == _GGUF_ARRAY and depth < 2:
            element = self.scalar(4, what)
            if element in _GGUF_SCALARS:  # skipped whole: only scalar fields are kept
                size = struct.calcsize(_GGUF_SCALARS[element])
                self.take(size * self.count(f"elements of {what}", size), what)
            else:
                for _ in range(self.count(f"elements of {what}", 8)):
                    self.value(element, what, depth + 1)
            return None
        raise PretrainedError(f"{self.path}: {what} has value type {kind}; expected a GGUF type 0-12")


def gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The scalar fields of a .gguf file's header (arrays are checked and left out), after checking
    its magic, every count and length against the file's size, and that every tensor's data lies
    inside the file; a PretrainedError (one line) otherwise."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            if file.read(4) != b"GGUF":
                raise PretrainedError(f"{path} is not a readable GGUF file (no GGUF magic); "
                                      "expected a .gguf model file")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _read_header(path, data)
    except (OSError, ValueError) as error:
        raise PretrainedError(f"{path} is not a readable GGUF file ({error}); expected a .gguf model file") from None


def _read_header(path: Path, data: Any) -> dict[str, Any]:
    header = _Header(path, data)
    header.take(4, "the magic")
    version = header.scalar(4, "the version")
    if version not in (2, 3):
        raise PretrainedError(f"{path} is GGUF version {version}; expected 2 or 3")
    n_tensors = header.count("tensors", 8 + 4 + 8 + 4 + 8)
    n_fields = header.count("metadata fields", 8 + 4 + 1)
    fields: dict[str, Any] = {}
    for _ in range(n_fields):
        key = header.string("a field name")
        value = header.value(header.scalar(4, f"the type of {key}"), key)
        if value is not None:
            fields[key] = value
    tensors = []
    for _ in range(n_tensors):
        name = header.string("a tensor name")
        n_dims = header.scalar(4, f"the rank of {name}")
        if n_dims > 8:
            raise PretrainedError(f"{path}: tensor {name} has rank {n_dims}; expected at most 8 (a damaged file)")
        shape = [header.scalar(10, f"the shape of {name}") for _ in range(n_dims)]
        tensors.append((name, shape, header.scalar(4, f"the type of {name}"),
                        header.scalar(10, f"the offset of {name}")))
    alignment = fields.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment < 1:
        raise PretrainedError(f"{path}: general.alignment {alignment!r}; expected a positive integer")
    start = -(-header.position // alignment) * alignment
    _check_tensor_data(path, tensors, start, len(data))
    return fields


def _check_tensor_data(path: Path, tensors: list, start: int, size: int) -> None:
    try:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError:  # the loader says how to install gguf
        return
    for name, shape, kind, offset in tensors:
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise PretrainedError(f"{path}: tensor {name} has type {kind}, which gguf does not know") from None
        elements = 1
        for dimension in shape:
            elements *= dimension
        end = start + offset + elements // block * block_bytes
        if end > size:
            raise PretrainedError(f"{path} is truncated or damaged: tensor {name} ends at byte {end}, beyond the "
                                  f"file's {size} bytes; expected a complete .gguf model file")


def read_json_object(file: Path) -> dict[str, Any] | None:
    """A small JSON object file, None where absent; a PretrainedError where too large, not JSON or not an object."""
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        return None
    except OSError as error:
        raise PretrainedError(f"{file} cannot be read ({error})") from None
    if size > MAX_CONFIG_BYTES:
        raise PretrainedError(f"{file} is {size} bytes; expected a JSON file under {MAX_CONFIG_BYTES >> 20} MiB")
    try:
        record = json.loads(file.read_bytes())
    except (OSError, ValueError) as error:
        raise PretrainedError(f"{file} is not readable JSON ({' '.join(str(error).split())[:120]})") from None
    if not isinstance(record, dict):
        raise PretrainedError(f"{file} holds a JSON {type(record).__name__}; expected an object")
    return record


def refuse_remote_code(directory: Path) -> None:
    """A PretrainedError where `directory`'s config.json or tokenizer_config.json names code to run
    (`auto_map`): latentcode loads models with transformers' own classes only."""
    for name in REMOTE_CODE_FILES:
        file = Path(directory) / name
        try:
            record = read_json_object(file)
        except PretrainedError:
            continue  # unreadable: the directory's other checks (or transformers') say so
        auto_map = (record or {}).get("auto_map")
        if auto_map:
            first = next(iter(auto_map.items()), None) if isinstance(auto_map, dict) else ("auto_map", auto_map)
            entry = f"{first[0]}: {first[1]}" if first else repr(auto_map)
            raise PretrainedError(
                f"{file} has an auto_map ({' '.join(str(entry).split())[:200]}) naming Python code of the model's own "
                "to run; latentcode never runs it (trust_remote_code=False): expected a model transformers loads with "
                "its built-in classes (remove the auto_map if the architecture is a built-in one)")


def directory_config(path: Path) -> dict[str, Any]:
    """config.json of a Hugging Face directory (with its text_config's fields on top), after checking
    the counts of heads and layers that the attention shape is made of."""
    config = read_json_object(path / "config.json")
    if config is None:
        raise PretrainedError(f"{path} has no config.json; expected a Hugging Face model directory")
    text = config.get("text_config")
    config = {**config, **(text if isinstance(text, dict) else {})}
    for keys in (("num_attention_heads", "n_head"), ("num_hidden_layers", "n_layer")):
        value = next((config[key] for key in keys if key in config), None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise PretrainedError(f"{path}/config.json has {keys[0]} {value!r}; expected a positive integer")
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if kv_heads is not None and (isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1
                                 or (isinstance(heads, int) and heads % kv_heads)):
        raise PretrainedError(f"{path}/config.json has num_key_value_heads {kv_heads!r}; expected a positive "
                              f"divisor of num_attention_heads {heads}")
    for key in ("hidden_size", "max_position_embeddings", "vocab_size"):
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise PretrainedError(f"{path}/config.json has {key} {value!r}; expected a positive integer")
    return config


def check_model_directory(path: Path) -> dict[str, Any]:
    """A Hugging Face directory latentcode can load, or one PretrainedError: config.json (see
    `directory_config`), no auto_map, and weights in safetensors (a pickled pytorch_model.bin is
    refused: torch would refuse to unpickle it too, as a traceback). Its config."""
    if not path.is_dir():
        raise PretrainedError(f"no model at {path}; expected a Hugging Face model directory, a .gguf file or the "
                              "name 'smollm2'")
    config = directory_config(path)
    refuse_remote_code(path)
    if not any(path.glob("*.safetensors")):
        pickled = sorted(item.name for item in path.glob("*.bin"))
        if pickled:
            raise PretrainedError(f"{path} holds its weights as {', '.join(pickled)}, a pickle, which latentcode does "
                                  "not load; expected model.safetensors (convert it where you trust the file: "
                                  "transformers' save_pretrained writes safetensors)")
        raise PretrainedError(f"{path} holds no weights (no *.safetensors file); expected model.safetensors beside "
                              "config.json")
    return config
