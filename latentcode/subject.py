"""`Subject`: the one object every command takes for a model, whatever it is, described before torch.

    subject = subject_of("runs/sraven-hyla")    # a run, a model directory, "smollm2", a Hugging Face
                                                # directory, a .gguf file, or a model object
    subject.name, subject.n_layers, subject.n_heads, subject.n_ctx   # its attention shape (files only)
    task = subject.task(None)                   # what it reads: its run's Task, or `TokenWindows`
    loaded = subject.load(device="cuda", dtype="bfloat16")          # the model (eval, placed), identity

A trained latentcode model reads its task's instances; a causal LM reads windows of the language
corpus's tokens (`latentcode.token_windows.TokenWindows`, a task like the others). The plans of extract,
intervene and patch ask a Subject what they need; `subject_of` is the one place that tells models apart.
JSON and numpy only until `load`.
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from latentcode.errors import UsageError, about
from latentcode.rundir import ModelSource, is_pretrained, locate_model
from latentcode.tasks import Task, get_task
from latentcode.validation import check_fits_in_memory, place

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Loaded:
    """A subject's model, loaded: `model` in eval mode where and in what it runs; `name`; `identity`,
    what a codes file or a summary records of it (model_name, model_config, checkpoint_sha256, ...);
    `tokenizer` (a causal LM's). `inputs(x)` is what the model is called with for token ids or task
    inputs `x` (a tensor, or keyword arguments), and `logits(x)` its output there."""

    model: Any
    name: str
    identity: Mapping[str, Any]
    tokenizer: Any = None
    pretrained: Any = None  # the `latentcode.pretrained.Pretrained` of a causal LM

    def inputs(self, x: Any) -> Any:
        return x if self.tokenizer is None else {"input_ids": x, "use_cache": False}

    def logits(self, x: Any) -> Any:
        if self.tokenizer is None:
            return self.model(x)
        return self.model(**self.inputs(x)).logits

    def last_logits(self, x: Any, positions: int = 1) -> Any:
        """`[batch, positions, vocabulary]`: the logits of the last `positions` of inputs `x`; a causal LM
        of transformers computes only those (`logits_to_keep`: at T = 8,192 every position's logits are
        1.5 GiB, a bare forward's whole peak), a model that cannot computes them all."""
        if self.tokenizer is None:
            return self.model(x)[:, -positions:]
        import inspect

        keep = {"logits_to_keep": positions} if "logits_to_keep" in inspect.signature(self.model.forward).parameters \
            else {}
        return self.model(**self.inputs(x), **keep).logits[:, -positions:]

    @property
    def device(self) -> Any:
        parameter = next(self.model.parameters(), None)
        return "cpu" if parameter is None else parameter.device

    @property
    def dtype_name(self) -> str:
        parameter = next(self.model.parameters(), None)
        return "float32" if parameter is None else str(parameter.dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Subject(abc.ABC):
    """A model described from its files: where it comes from (`source`, for provenance), its `name`,
    and its attention shape: `n_layers` layers of `n_heads` heads over at most `n_ctx` positions
    (None: no limit known); `model_config` a latentcode model's config as JSON (memory estimates;
    empty for a causal LM)."""

    source: ModelSource
    name: str
    n_layers: int
    n_heads: int
    n_ctx: int | None
    model_config: Mapping[str, Any] = field(default_factory=dict)
    reads_text: ClassVar[bool] = False
    """Whether its inputs are token windows of text (a causal LM) rather than a task's instances."""
    compact_store: ClassVar[bool] = False
    """Whether its codes can be kept as a compact store (`latentcode.store.compact`): where its attention is
    softmax(q k^T) read at SDPA calls or transformers' eager registry (a causal LM; not a latentcode
    Transformer, whose sigma is not always a softmax over keys)."""

    @abc.abstractmethod
    def task(self, task: Any, default_seq_len: int | None = None) -> Any:
        """What the subject reads: `task` (a Task, its config, or None for the subject's own), checked;
        a causal LM's is `TokenWindows` of `task`'s seq_len (default `default_seq_len`)."""

    @abc.abstractmethod
    def load(self, device: str | None = None, dtype: str | None = None, progress: bool = False) -> Loaded:
        """The model, in eval mode, on `device` in `dtype` (None: a model loaded here on the CPU in
        float32, a model object where and as it is)."""

    def forward_pass_bytes(self, batch: int, seq_len: int) -> int:
        """A lower bound on the memory of one forward pass of `batch` sequences (0: not known)."""
        return 0


@dataclass(frozen=True)
class TrainedSubject(Subject):
    """A latentcode model: a run directory, a saved model directory, or a `Transformer` object
    (`model_object`, the object given)."""

    model_object: Any = None

    def task(self, task: Any, default_seq_len: int | None = None) -> Any:
        """`task` (a Task or its config), else the run's own."""
        if isinstance(task, Task):
            return task
        with about("task"):
            if task:
                return get_task(**task)
            if not self.source.task_config:
                what = f"{self.source.path} is a model directory" if self.source.path else "the model object comes"
                raise UsageError(f"{what} without its run: give its task, e.g. task={{'name': 'sraven'}} "
                                 "(--task name=sraven)")
            return get_task(**self.source.task_config)

    def forward_pass_bytes(self, batch: int, seq_len: int) -> int:
        from latentcode.validation import forward_pass_bytes

        return forward_pass_bytes(batch, seq_len, self.model_config)

    def load(self, device: str | None = None, dtype: str | None = None, progress: bool = False) -> Loaded:
        model, info = resolve_model(self.source if self.model_object is None else self.model_object)
        model = place(model, device, dtype).eval()
        return Loaded(model, info["model_name"], info)


@dataclass(frozen=True)
class LanguageModelSubject(Subject):
    """A pretrained causal LM (`latentcode.pretrained`): "smollm2", a Hugging Face directory or a .gguf
    file; `n_kv_heads` its key/value heads; `preloaded` a `Pretrained` given in Python."""

    n_kv_heads: int = 0
    preloaded: Any = None
    reads_text = True
    compact_store = True

    def task(self, task: Any, default_seq_len: int | None = None) -> Any:
        from latentcode.token_windows import token_windows

        return token_windows(self, task, default_seq_len)

    def load(self, device: str | None = None, dtype: str | None = None, progress: bool = False) -> Loaded:
        from latentcode.pretrained import checkpoint_sha256, load_pretrained
        if self.preloaded is not None:
            pretrained = self.preloaded
            place(pretrained.model, device, dtype)
        else:
            pretrained = load_pretrained(self.source.path, device=device, dtype=dtype, progress=progress)
        if (pretrained.n_layers, pretrained.n_heads) != (self.n_layers, self.n_heads):
            raise UsageError(f"{self.name} loaded with {pretrained.n_layers} layers of {pretrained.n_heads} heads, but "
                             f"its metadata says {self.n_layers} of {self.n_heads}; the model files disagree")
        pretrained.model.eval()
        config = pretrained.model.config.to_dict()
        identity = {
            "model_name": pretrained.name,
            # Not where this process loaded it from (`_name_or_path`: the GGUF's directory, or its cache entry
            # once cached; `model_path` says where the model is): ranks of one launch, and appends, agree.
            "model_config": {key: value for key, value in config.items()
                             if key not in ("quantization_config", "_name_or_path")},
            "checkpoint_sha256": checkpoint_sha256(pretrained.path),
            "model_path": str(pretrained.path.resolve()),
        }
        return Loaded(pretrained.model, pretrained.name, identity, pretrained.tokenizer, pretrained)


def subject_of(run_or_model: Any) -> Subject:
    """The Subject of what a user names as a model: a Subject (as it is), a path or name
    (`rundir.locate_model`: a run, a model directory, or a pretrained causal LM), a latentcode model
    object, or a loaded `Pretrained`; anything else refused in one line."""
    if isinstance(run_or_model, Subject):
        return run_or_model
    torch = sys.modules.get("torch")  # a model object comes with torch imported; a path needs none
    if torch is not None and isinstance(run_or_model, torch.nn.Module):
        info = resolve_model(run_or_model)[1]  # a latentcode Transformer, or the one line pointing to Recorder
        return _trained_subject(ModelSource(None, model_config=info["model_config"]), run_or_model)
    if type(run_or_model).__name__ == "Pretrained" and hasattr(run_or_model, "tokenizer"):
        pretrained = run_or_model
        return LanguageModelSubject(locate_model(pretrained.path), pretrained.name, pretrained.n_layers,
                                    pretrained.n_heads, pretrained.n_ctx or None, n_kv_heads=pretrained.n_kv_heads,
                                    preloaded=pretrained)
    if not isinstance(run_or_model, (str, Path, ModelSource)):
        with about("run_or_model"):
            raise UsageError(f"run_or_model is a {type(run_or_model).__name__}; expected a run or model directory, a "
                             "pretrained model (a Hugging Face directory, a .gguf file, 'smollm2') or a model object")
    with about("run_or_model"):
        source = run_or_model if isinstance(run_or_model, ModelSource) else locate_model(run_or_model)
        if source.path is not None and source.model_path is None and is_pretrained(source.path):
            return _language_model_subject(source)
        return _trained_subject(source)


def _language_model_subject(source: ModelSource) -> LanguageModelSubject:
    from latentcode.pretrained import attention_shape, check_model_directory, resolve

    path = resolve(source.path)  # a missing SmolLM2 package is one line here
    if not path.exists():
        raise UsageError(f"{path} does not exist; expected a run directory, a model directory or a .gguf file")
    if path.is_dir():
        check_model_directory(path)  # weights, heads, no auto_map: one line before torch
    shape = attention_shape(source.path)  # a damaged .gguf header is one line here
    return LanguageModelSubject(source, str(source.path), shape.n_layers, shape.n_heads, shape.n_ctx or None,
                                n_kv_heads=shape.n_kv_heads)


def _trained_subject(source: ModelSource, model_object: Any = None) -> TrainedSubject:
    config = checked_model_config(source)
    name = str(source.path) if source.path is not None else str(config.get("attention", "model"))
    heads = int(config.get("n_heads") or 1) * int(config.get("width_factor") or 1)  # ModelConfig scales them
    return TrainedSubject(source, name, int(config["n_layers"]), heads,
                          config.get("n_ctx"), config, model_object)


def checked_model_config(source: ModelSource) -> dict[str, Any]:
    """The model's config as JSON, checked as a model can be built from it (no torch) and small
    enough for this machine's memory."""
    from latentcode.models.config import ConfigError, check_model_config, parameter_bytes

    config = source.model_config
    with about("run_or_model"):
        if source.path is not None and source.model_path == source.path:  # a saved model directory
            if not isinstance(config, dict):
                raise UsageError(f"{source.path}/config.json holds a JSON {type(config).__name__}; expected an "
                                 "object of ModelConfig fields")
            try:  # a model directory's own config, checked as a run's is
                check_model_config(config)
            except ConfigError as error:
                raise UsageError(f"{source.path}: its config.json is not a config a model can be built from: "
                                 f"{error}") from None
        if not isinstance(config, dict) or not isinstance(config.get("n_layers"), int):
            raise UsageError(f"{source.path}: its model config names no number of layers (n_layers)")
        check_fits_in_memory(parameter_bytes(config), f"{source.path}: the model its config describes")
    return config


def resolve_model(run_or_model: str | Path | ModelSource | nn.Module) -> tuple[nn.Module, dict[str, Any]]:
    """The model and what the codes file records about it: name, config, checkpoint hash, task.
    A path is located by `rundir.locate_model` (its one message for what is no model)."""
    from torch import nn  # noqa: F811 - at run time too

    from latentcode.models import load_model
    from latentcode.models.transformer import Transformer
    from latentcode.provenance import sha256_of_state
    from latentcode.safe_reads import sha256_of_file

    if isinstance(run_or_model, nn.Module):
        model = run_or_model
        if not isinstance(model, Transformer):
            with about("run_or_model"):
                raise UsageError(
                    f"run_or_model is a {type(model).__name__}; extract, intervene and patch take latentcode models "
                    "and causal LMs (a run or model directory, a Transformer, 'smollm2', a Hugging Face directory, "
                    "a .gguf file, a loaded Pretrained); for any other module record with "
                    "latentcode.extraction.Recorder and edit with latentcode.intervention.Intervention")
        checkpoint_sha256, task_config = sha256_of_state(model), None
    else:
        with about("run_or_model"):
            source = run_or_model if isinstance(run_or_model, ModelSource) else locate_model(run_or_model)
            if source.model_path is None:
                raise UsageError(f"{source.path} is a pretrained model; expected a latentcode run or model directory")
        model = load_model(source.model_path)
        checkpoint_sha256, task_config = sha256_of_file(source.weights_path), source.task_config
    return model, {"model_name": model.config.attention_name, "model_config": model.config.to_dict(),
                   "checkpoint_sha256": checkpoint_sha256, "task_config": task_config}
