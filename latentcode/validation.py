"""The checks of values a user passes, written once: the command line and the Python API call the
same function, so both refuse a value with the same message.

Standard library only (no numpy, no torch): the command line calls these before it imports anything
heavy. Each check returns the value or raises `UsageError` (or the `error` class its caller names: a
task raises its `TaskError`) saying what was wrong, the value received and what is expected. `flag`
names the value as the user wrote it, e.g. `--split`; the message then starts with it.
"""

from __future__ import annotations

import numbers
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from latentcode.errors import LatentcodeError, UsageError, about

SEED_LIMIT = 2**32  # numpy's and torch's seeds are 32-bit: a larger one is refused, not a traceback


def _where(flag: str | None) -> str:
    return f"{flag}: " if flag else ""


def check_split(split: str, task: Any, flag: str | None = None, *,
                error: type[LatentcodeError] = UsageError) -> str:
    """`split`, if `task` (a Task or a Task class: its `name` and `splits`) has it."""
    if split not in task.splits:
        raise error(f"{_where(flag)}unknown split {split!r} for task {task.name!r}; valid splits: {list(task.splits)}")
    return split


def check_variant(variant: str, task: Any, flag: str | None = None, *,
                  error: type[LatentcodeError] = UsageError) -> str:
    """`variant`, if `task` (a Task or a Task class: its `name` and `variants`) has it."""
    if variant not in task.variants:
        raise error(f"{_where(flag)}unknown variant {variant!r} for task {task.name!r}; "
                    f"valid variants: {list(task.variants)}")
    return variant


def check_integer(name: str, value: Any, minimum: int | None = None, maximum: int | None = None, *,
                  error: type[LatentcodeError] = UsageError) -> int:
    """`value` as an int (a bool is no integer here), if `minimum <= value <= maximum` (either bound
    may be None)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name}={value!r} must be an integer")
    value = int(value)
    if minimum is not None and value < minimum:
        raise error(f"{name}={value} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise error(f"{name}={value} must be at most {maximum}")
    return value


def describe_integer_range(minimum: int, maximum: int | None = None) -> str:
    """The integers `check_integer(..., minimum, maximum)` accepts, in words: 'a positive integer',
    'a non-negative integer below 4294967296', 'an integer of at least 3'."""
    expected = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer of at least {minimum}")
    return expected if maximum is None else f"{expected} below {maximum + 1}"


# -- outputs and resources: the command line's checks and the plan steps of the Python API alike -------------
def _why_not_writable(directory: Path) -> str:
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "no write permission, or the directory is immutable"


def check_output(path: str | Path, flag: str | None = None, kind: str = "file") -> Path:
    """Refuse, before anything is computed, an output that cannot be written where asked.

    kind: "file" (must not be a directory), "directory" (must not be a file) or "stem" (the
    start of file names, e.g. a figure's; either is fine). The nearest existing directory on the
    way to `path` must be one this process may write in, and one that lets it create something:
    an empty directory is made there and removed at once. `flag` starts each message (None: the
    message starts with the path; a plan step names its parameter with `errors.about`).
    """
    from latentcode.files import check_replaceable

    path = Path(path)
    named = f"{flag} {path}" if flag else str(path)
    choose = f"another {flag}" if flag else "another path"
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as error:  # a name too long, a loop of links: one line, not a traceback
        raise UsageError(f"{named}: {error.strerror}") from None
    if kind == "file" and path.is_dir():
        raise UsageError(f"{named} is a directory; expected the name of a file to write")
    if kind == "directory" and path.exists() and not path.is_dir():
        raise UsageError(f"{named} is a file; expected a directory (a new or an empty one)")
    place = path if kind == "directory" and path.is_dir() else path.parent
    while not place.exists() and place != place.parent:
        place = place.parent
    if place.exists() and not place.is_dir():
        raise UsageError(f"{named}: {place} is a file, not a directory, so nothing can be written under it")
    if not os.access(place, os.W_OK | os.X_OK):
        raise UsageError(f"{named}: cannot write in {place} ({_why_not_writable(place)}); choose {choose}")
    try:  # permissions pass, yet some places refuse every new entry (/proc, /sys; root passes os.access anywhere)
        os.rmdir(tempfile.mkdtemp(prefix=".latentcode-check-", dir=place))
    except OSError as error:
        raise UsageError(f"{named}: cannot write in {place} (creating anything there fails: {error.strerror}); "
                         f"choose {choose}") from None
    if kind == "file":
        check_replaceable(path, flag or "")  # a symbolic link, a device or a FIFO is never written through
    return path


def check_output_stem(out: str | Path, suffixes: tuple[str, ...], overwrite: bool) -> Path:
    """A stem whose files (stem + each suffix: a table, its figures) can be written: a place that can
    be written (`check_output`), none of them anything but a regular file, and none there already
    unless `overwrite`: a result written earlier is never lost by running again. A stem given with
    one of the suffixes (`--out heat.png`) stands for the stem without it (not heat.png.png)."""
    from latentcode.errors import OutputExistsError
    from latentcode.files import check_replaceable

    out = Path(out)
    stem = check_output(out.with_suffix("") if out.suffix in suffixes else out, kind="stem")
    paths = [stem.with_name(stem.name + suffix) for suffix in suffixes]
    for path in paths:
        check_replaceable(path)
    existing = [str(path) for path in paths if path.exists()]
    if existing and not overwrite:
        raise OutputExistsError(f"{stem}: {', '.join(existing)} already exist; pass overwrite=True (--overwrite) to "
                                "replace them, or choose another path")
    return stem


# -- resources -------------------------------------------------------------------------------------
def machine_memory() -> int | None:
    """The machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def describe_bytes(n_bytes: float) -> str:
    """`n_bytes` in GiB, or TiB from 1 TiB: "7.3 GiB", "16.0 TiB"."""
    return f"{n_bytes / 2**30:,.1f} GiB" if n_bytes < 2**40 else f"{n_bytes / 2**40:,.1f} TiB"


def forward_pass_bytes(batch: int, seq_len: int, model_config: Mapping) -> int:
    """A lower bound on the memory of one forward pass of `batch` sequences: one layer's widest
    activations `[batch, sequence, width]` and one attention tensor `[batch, head, query, key]`, float32."""
    width = max(int(model_config.get(key) or 0) for key in ("d_in", "d_model", "d_mlp", "d_vocab", "d_out"))
    heads = int(model_config.get("n_heads") or 1)
    return 4 * batch * seq_len * (width + heads * seq_len)


def check_fits_in_memory(n_bytes: int, what: str) -> None:
    """Refuse work whose memory need (a lower bound, `what` says of what) exceeds the machine's
    physical memory: it would fail with a traceback (numpy's "Unable to allocate 7.3 TiB") or swap."""
    memory = machine_memory()
    if memory is not None and n_bytes > memory:
        raise UsageError(f"{what} needs at least {describe_bytes(n_bytes)} of memory; this machine has "
                         f"{describe_bytes(memory)}")


def check_fits_on_disk(n_bytes: int, out: Path, compression: str, what: str) -> None:
    """Refuse codes (`n_bytes` uncompressed; `what` says of what) that cannot fit on the disk of `out`,
    before hours of extraction end on a full disk. Compressed codes may shrink a lot (the zeros of
    causal patterns), so with compression only a need above ten times the free space is refused."""
    try:
        info = os.statvfs(out.parent)
    except (AttributeError, OSError):
        return
    free = info.f_bavail * info.f_frsize
    if n_bytes > (free if compression == "none" else 10 * free):
        compressed = "" if compression == "none" else f" (more than ten times that, so even {compression} will not fit)"
        raise UsageError(f"{what} need {describe_bytes(n_bytes)} on disk; {out.parent} has {describe_bytes(free)} "
                         f"free{compressed}: "
                         "extract fewer instances or sites")


#: the floating-point types a model may be loaded and run in (`dtype=`, `--dtype`); codes are float32 always
DTYPES = ("float32", "bfloat16", "float16")
_DEVICE_KINDS = ("cpu", "cuda", "mps", "xpu")


def check_dtype(dtype: Any) -> str:
    """The name of `dtype` (a name, or a torch dtype such as torch.bfloat16), one of `DTYPES`."""
    name = str(dtype).removeprefix("torch.") if dtype is not None else "float32"
    if name not in DTYPES:
        raise UsageError(f"dtype {dtype!r} is not one the models run in; expected one of {', '.join(DTYPES)}")
    return name


def check_device(device: Any) -> str:
    """The name of `device` ("cpu", "cuda", "cuda:1", a torch.device; None: "cpu"), its form checked
    without torch; whether this machine has it is checked where torch is loaded (`available_device`)."""
    name = "cpu" if device is None else str(device)
    kind, _, index = name.partition(":")
    if kind not in _DEVICE_KINDS or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise UsageError(f"device {device!r} is not a device name; expected cpu, cuda, cuda:N (N a GPU's number), "
                         "mps or xpu")
    return name


def available_device(device: Any) -> str:
    """`check_device(device)`, and refused in one line where this machine lacks it (imports torch)."""
    name = check_device(device)
    kind, _, index = name.partition(":")
    if kind == "cpu":
        return name
    import torch

    backend = getattr(torch, kind, None)
    count = backend.device_count() if backend is not None and backend.is_available() else 0
    if kind == "mps":
        count = int(torch.backends.mps.is_available())
    if count == 0:
        raise UsageError(f"device {device!r}: this machine has no {kind.upper()} device "
                         f"(torch.{kind}.is_available() is False); expected cpu")
    if index and int(index) >= count:
        raise UsageError(f"device {device!r}: this machine has {count} {kind.upper()} device(s); expected "
                         f"{kind}:0 to {kind}:{count - 1}")
    return name


def check_placement(device: Any, dtype: Any) -> tuple[str | None, str | None]:
    """`device` and `dtype` as every entry point that runs a model takes them, checked once here: the dtype
    one of `DTYPES`, the device present on this machine (torch is imported only for a device other than the
    CPU). None stays None: the caller's default. Each refusal is one line naming the value and what is accepted."""
    with about("device"):
        device = None if device is None else available_device(device)
    with about("dtype"):
        dtype = None if dtype is None else check_dtype(dtype)
    return device, dtype


def place(model: Any, device: str | None, dtype: str | None) -> Any:
    """`model` (an `nn.Module`) moved to `device` and cast to `dtype` where given (as `nn.Module.to`
    does: floating parameters and buffers), returned; both None: as it is."""
    if device is None and dtype is None:
        return model
    import torch

    return model.to(device=device, dtype=None if dtype is None else getattr(torch, check_dtype(dtype)))
