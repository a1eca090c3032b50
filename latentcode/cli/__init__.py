"""The `latentcode` command line: thin wrappers that parse arguments and call the public API.

A command first checks its arguments (`checks`), with the standard library, JSON and h5py only:
files exist and are what they should be, outputs can be written, codes files and runs belong
together, labels and splits exist. Only then does its handler import torch or scikit-learn and call
the functions a Python user calls. So a mistake is answered at once, as one line, `error: ...`, with
exit status 2, naming the flag, the value received and what is expected; errors the library raises
for what only it can see are printed the same way (set LATENTCODE_DEBUG=1 for their traceback).
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from latentcode.errors import LatentcodeError, UsageError
from latentcode.training.config import MIXED_PRECISION

# What the user can fix: our own errors, and files that are missing or already there. Anything else is
# a bug and keeps its traceback.
USER_ERRORS = (LatentcodeError, FileExistsError, FileNotFoundError)

Handler = Callable[[argparse.Namespace], int | None]
Check = Callable[[argparse.Namespace], None]
_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []
_CHECKS: dict[str, Check] = {}


def subcommand(register: Callable[[argparse._SubParsersAction], None]):
    """Decorator: `register(subparsers)` adds one subcommand (with `set_defaults(handler=...)`)."""
    _SUBCOMMANDS.append(register)
    return register


def checks(command: str) -> Callable[[Check], Check]:
    """Decorator: the function checks `command`'s arguments before its handler imports anything
    heavy (it may fill in values it resolved, e.g. a default label), raising a `UsageError`."""

    def register(check: Check) -> Check:
        _CHECKS[command] = check
        return check

    return register


class CommandLineParser(argparse.ArgumentParser):
    """argparse with one-line errors, and epilogs built only when help is printed."""

    def error(self, message: str):
        # argparse would print the whole usage block first; one line says where to find it.
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        if callable(self.epilog):  # e.g. the preset table, which needs the task modules
            self.epilog = self.epilog()
        return super().format_help()


# -- argument types and checks (standard library only) --------------------------------------------
def integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (and at most `maximum`)."""
    expected = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer of at least {minimum}")
    if maximum is not None:
        expected += f" below {maximum + 1}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def number(positive: bool) -> Callable[[str], float]:
    """An argparse type: a finite positive (or non-negative) number."""
    expected = "a positive number" if positive else "a non-negative number"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def finite_number(text: str) -> float:
    """An argparse type: any finite number (nan and inf would make every result NaN, silently)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def one_of(values: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in values:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(values)}, got {text!r}")
        return text

    return parse


POSITIVE_INTEGER, NON_NEGATIVE_INTEGER = integer(1), integer(0)
SEED_LIMIT = 2**32  # numpy's and torch's seeds are 32-bit: a larger one is refused, not a traceback
SEED = integer(0, SEED_LIMIT - 1)
POSITIVE_NUMBER, NON_NEGATIVE_NUMBER = number(positive=True), number(positive=False)


def check_input_file(path: str | Path, what: str) -> Path:
    """An existing, readable file (not a directory)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory; expected a file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{what} {path} cannot be read (no read permission)")
    return path


def _why_not_writable(directory: Path) -> str:
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "no write permission, or the directory is immutable"


def progress_bars(args: argparse.Namespace) -> bool:
    """Progress bars unless --quiet, and only where stderr is a terminal: piped into a file or a log,
    a bar is a stream of carriage returns and escape codes (training prints plain lines there instead)."""
    return not args.quiet and sys.stderr.isatty()


def check_output(path: str | Path, flag: str, kind: str = "file") -> Path:
    """Refuse, before anything is computed, an output that cannot be written where asked.

    kind: "file" (must not be a directory), "directory" (must not be a file) or "stem" (the
    start of file names, e.g. a figure's; either is fine). The nearest existing directory on the
    way to `path` must be one this process may write in.
    """
    from latentcode.files import check_replaceable

    path = Path(path)
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as error:  # a name too long, a loop of links: one line, not a traceback
        raise UsageError(f"{flag} {path}: {error.strerror}") from None
    if kind == "file" and path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; expected the name of a file to write")
    if kind == "directory" and path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file; expected a directory (a new or an empty one)")
    place = path if kind == "directory" and path.is_dir() else path.parent
    while not place.exists() and place != place.parent:
        place = place.parent
    if place.exists() and not place.is_dir():
        raise UsageError(f"{flag} {path}: {place} is a file, not a directory, so nothing can be written under it")
    if not os.access(place, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot write in {place} ({_why_not_writable(place)}); choose another {flag}")
    if kind == "file":
        check_replaceable(path, flag)  # a symbolic link, a device or a FIFO is never written through
    return path


def check_stem_free(stem: str | Path, suffixes: Sequence[str], overwrite: bool, flag: str = "--out") -> None:
    """Refuse to replace files already written at `stem` + each suffix (tables, figures) unless
    --overwrite: a result written earlier is never lost by running a command again."""
    from latentcode.files import check_replaceable

    stem = Path(stem)
    for suffix in suffixes:
        check_replaceable(stem.with_name(stem.name + suffix), flag)
    existing = [str(stem.with_name(stem.name + suffix)) for suffix in suffixes
                if stem.with_name(stem.name + suffix).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{flag} {stem}: {', '.join(existing)} already exist; add --overwrite to replace "
                              f"them, or choose another {flag}")


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:,.1f} GiB" if n_bytes < 2**40 else f"{n_bytes / 2**40:,.1f} TiB"


def machine_memory() -> int | None:
    """The machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


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
        raise UsageError(f"{what} needs at least {_gib(n_bytes)} of memory; this machine has {_gib(memory)}")


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
        raise UsageError(f"{what} need {_gib(n_bytes)} on disk; {out.parent} has {_gib(free)} free{compressed}: "
                         "extract fewer instances or sites")


@contextlib.contextmanager
def _command_outputs(stem: str | Path, suffixes: Sequence[str], overwrite: bool, purpose: str) -> Iterator:
    """One command's outputs at `stem` as one set (latentcode.files.AtomicOutputs: every writer inside
    joins it; all renamed at the end, or none), its lock held throughout. Under the lock the stem is
    checked again: a second command to the same --out, started beside the first, finds its files
    and is refused instead of replacing them."""
    from latentcode.files import AtomicOutputs

    with AtomicOutputs(lock=stem, purpose=purpose) as outputs:
        check_stem_free(stem, suffixes, overwrite)
        yield outputs


def _formats(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(args.format or ["png"])


def open_codes_files(paths: Sequence[str | Path], what: str = "codes file") -> list:
    """The `CodeFile`s of `paths` (h5py only), each checked to exist and to be a readable codes file."""
    for path in paths:
        check_input_file(path, what)
    from latentcode.store import CodeFile

    return [CodeFile(path) for path in paths]


def _available_labels(code_file) -> list[str]:
    present = [name for name, has in (("prediction", code_file.has_prediction), ("target", code_file.has_target))
               if has]
    return [*code_file.label_names, *present, *code_file.extra_names]


def _label_name(spec: str) -> str:
    return str(spec).split("[", 1)[0].strip()


def check_label(code_file, spec: str, flag: str) -> None:
    """The label spec names a per-example array of the file (its index is checked when read)."""
    if _label_name(spec) not in _available_labels(code_file):
        raise UsageError(f"{flag} {spec}: {code_file.path} has no label {_label_name(spec)!r}; "
                         f"its labels are {_available_labels(code_file)}")


def check_decodable(code_file, spec: str, flag: str, split: str) -> None:
    """A label a probe can learn: not one value for every example of the fitting split (for a
    multi-column label such as term_present, not one value per column: nothing to decode)."""
    name = _label_name(spec)
    if spec.strip() != name or name not in code_file.label_names:
        return  # one column of a label, or a prediction: the probe checks it when it reads it
    values = code_file.labels(name, split)
    rows = values.reshape(len(values), -1)
    if len(rows) and (rows == rows[:1]).all():
        same = (f"in each of its {rows.shape[1]} columns" if rows.shape[1] > 1 else f"({rows[0, 0]})")
        raise UsageError(
            f"{flag} {spec}: every example of split {split!r} in {code_file.path} has the same value {same}; "
            f"a probe needs at least two classes to learn from (choose another {flag} or --fit-split)"
        )


def check_splits(code_file, splits: Mapping[str, str | None]) -> None:
    """Each `{flag: split}` names a split of the file."""
    for flag, split in splits.items():
        if split is not None and split not in code_file.splits:
            raise UsageError(f"{flag} {split}: {code_file.path} has no split {split!r}; its splits are {code_file.splits}")


# -- latentcode tasks ------------------------------------------------------------------------------
@subcommand
def _tasks(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tasks", help="inspect the tasks (SRAVEN ambiguity, counts)")
    commands = parser.add_subparsers(dest="tasks_command", required=True, metavar="COMMAND")
    ambiguity = commands.add_parser(
        "ambiguity",
        help="Monte Carlo estimate of the fraction of ambiguous SRAVEN instances",
        description="Estimate the fraction of SRAVEN instances whose 8 context panels admit "
        "another rule assignment with a different answer (see latentcode.tasks.ambiguity).",
    )
    ambiguity.add_argument("--features", type=integer(1), default=4, help="M, features per panel (default 4)")
    ambiguity.add_argument("--values", type=integer(3), default=8, help="K, values per feature (default 8)")
    ambiguity.add_argument("--n", type=POSITIVE_INTEGER, default=4096, help="instances to check (default 4096)")
    ambiguity.add_argument("--seed", type=SEED, default=0)
    ambiguity.add_argument(
        "--criterion", choices=("all_features", "any_feature"), default="all_features",
        help="all_features: the authors' criterion (default); any_feature: the paper's wording",
    )
    ambiguity.add_argument(
        "--rules", choices=("strict", "authors"), default="strict",
        help="when distribute_three fits: strict, only as the generator makes it (default); "
        "authors, the authors' looser checker (with all_features: the paper's Table A2)",
    )
    ambiguity.set_defaults(handler=_run_ambiguity)

    counts = commands.add_parser("count", help="number of possible SRAVEN tasks and instances")
    counts.add_argument("--features", type=integer(2), default=4)
    counts.add_argument("--values", type=integer(3), default=8)
    counts.set_defaults(handler=_run_counts)


def _run_ambiguity(args: argparse.Namespace) -> None:
    import time

    from latentcode.tasks.sraven import estimate_ambiguity

    start = time.perf_counter()
    fraction, standard_error = estimate_ambiguity(
        args.features, args.values, args.n, args.seed, args.criterion, args.rules
    )
    seconds = time.perf_counter() - start
    print(
        f"M={args.features} K={args.values} n={args.n} criterion={args.criterion} "
        f"rules={args.rules}: "
        f"ambiguous fraction {fraction:.4f} ± {standard_error:.4f} (standard error), {seconds:.2f} s"
    )


def _run_counts(args: argparse.Namespace) -> None:
    from latentcode.tasks.sraven import count_instances, count_tasks

    print(f"SRAVEN M={args.features} K={args.values}: {count_tasks(args.features):,} tasks, "
          f"{count_instances(args.features, args.values):.3e} labelled instances")


def parse_value(text: str):
    """A command-line value: JSON (numbers, true/false/null, lists) where it parses, else the string."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_assignments(items: Sequence[str] | None, what: str) -> dict:
    values = {}
    for item in items or []:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise UsageError(f"{what} expects KEY=VALUE, got {item!r}")
        values[key.strip().replace("-", "_")] = parse_value(value)
    return values


# -- latentcode train -------------------------------------------------------------------------------
TRAIN_OVERRIDES = (
    # flag, field, type, help
    ("--seed", "seed", SEED, "training seed: initialization, data stream and dropout (default 0)"),
    ("--lr", "learning_rate", POSITIVE_NUMBER, "peak learning rate"),
    ("--weight-decay", "weight_decay", NON_NEGATIVE_NUMBER, "AdamW weight decay (matrices only)"),
    ("--warmup-steps", "warmup_steps", NON_NEGATIVE_INTEGER, "linear warmup steps"),
    ("--batch-size", "batch_size", POSITIVE_INTEGER, "global batch size"),
    ("--instances", "n_train_instances", POSITIVE_INTEGER, "training instances (overrides the scale)"),
    ("--n-layers", "n_layers", POSITIVE_INTEGER, "transformer blocks"),
    ("--width-factor", "width_factor", POSITIVE_INTEGER, "multiplies d_model, kqv_dim, v_dim, d_mlp and n_heads"),
    ("--n-heads", "n_heads", POSITIVE_INTEGER, "attention heads"),
    ("--grad-clip", "grad_clip_norm", POSITIVE_NUMBER, "clip gradients to this global norm"),
    ("--mixed-precision", "mixed_precision", one_of(MIXED_PRECISION),
     "auto (bf16 where supported), no, bf16 or fp16"),
    ("--gradient-accumulation-steps", "gradient_accumulation_steps", POSITIVE_INTEGER, "micro-batches per update"),
    ("--eval-every", "eval_every", POSITIVE_INTEGER, "steps between evaluations"),
    ("--eval-instances", "eval_instances", POSITIVE_INTEGER, "instances per evaluation split"),
    ("--checkpoint-every", "checkpoint_every", POSITIVE_INTEGER, "steps between checkpoints"),
    ("--log-every", "log_every", POSITIVE_INTEGER, "steps between log lines"),
    ("--variant", "variant", str, "task input variant to train and evaluate on (default the task's first; "
     "sraven: permuted, unpermuted; fuzzy_logic: uniform, fixed_context, fixed_query)"),
)


@subcommand
def _train(subparsers: argparse._SubParsersAction) -> None:
    def epilog() -> str:  # built when help is printed: the preset table imports the tasks
        from latentcode.training.presets import describe_presets

        return ("presets:\n" + describe_presets() + "\n\nscales: tiny (smoke test: a small model, a few dozen steps, "
                "seconds), demo (a few minutes), cpu (under an hour on 2 CPU cores), paper (the paper's budget)"
                "\n\nexamples:\n  latentcode train --preset fuzzy_logic --attention hyla --scale cpu --out runs/fuzzy-hyla"
                "\n  latentcode train --resume runs/fuzzy-hyla")

    parser = subparsers.add_parser(
        "train",
        help="train a model on a task (presets from the paper)",
        description="Train a hooked transformer with the paper's recipe (AdamW, linear warmup, cosine decay to "
        "0.1x, weight decay on matrices only, attention dropout 0.1). Runs on CPU, one GPU, several GPUs with "
        "`accelerate launch -m latentcode.cli train ...`, or several CPU processes with "
        "`torchrun --nproc_per_node 2 -m latentcode.cli train ...`. Writes a run directory with config.json, "
        "metrics.jsonl, checkpoints/, model/ and summary.json.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", help="fuzzy_logic, sraven or language (see below)")
    parser.add_argument("--attention", default="softmax",
                        help="attention preset (softmax, linear, hyla, ... or NORMALIZATION+VALUE_NETWORK; default softmax)")
    parser.add_argument("--scale", default="cpu", help="tiny, demo, cpu or paper (default cpu)")
    parser.add_argument("--out", help="run directory (default runs/PRESET-ATTENTION-SCALE-seedSEED)")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint")
    parser.add_argument("--config", metavar="JSON", help="a TrainConfig JSON file instead of a preset")
    for flag, field, kind, text in TRAIN_OVERRIDES:
        parser.add_argument(flag, dest=field, type=kind, help=text)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override any task, model or training field, e.g. --set frac_test=0.7 --set seq_len=16")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model for training")
    parser.add_argument("--threads", type=POSITIVE_INTEGER,
                        help="CPU threads of this process (default torch's, one per core; give each of several jobs "
                        "side by side its own, e.g. --threads 1 for two jobs on 2 cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.set_defaults(handler=_run_train)


def read_json_file(path: str, flag: str) -> dict:
    """The JSON object in the file `path` names, refused in one line naming the file otherwise."""
    import json

    text = check_input_file(path, flag).read_bytes()
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{flag} {path} is not a JSON file ({error})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{flag} {path} holds a JSON {type(data).__name__}; expected an object of TrainConfig fields")
    return data


@checks("train")
def _check_train(args: argparse.Namespace) -> None:
    """What can be checked without the model modules (which import torch): flags that go
    together, the preset, scale, variant and --set fields, the --config file, where the run goes."""
    from latentcode.tasks import task_class
    from latentcode.training.presets import MODEL_FIELDS, SCALES, TRAIN_FIELDS, presets, task_fields

    overrides = {field: getattr(args, field) for _, field, _, _ in TRAIN_OVERRIDES if getattr(args, field) is not None}
    given = [flag for flag, field, _, _ in TRAIN_OVERRIDES if field in overrides]
    given += ["--set"] * bool(args.set) + ["--compile"] * args.compile
    if args.resume:
        if args.preset or args.config:
            raise UsageError("--resume continues a run with its own config; do not combine it with --preset or --config")
        if given or args.out:
            raise UsageError(f"--resume continues a run with its own config and directory; "
                             f"{', '.join(given + ['--out'] * bool(args.out))} cannot change them")
        from latentcode.rundir import RunDirectory

        RunDirectory(args.resume).read_raw_config()
        return
    if args.config:
        if args.preset:
            raise UsageError("give either --preset or --config, not both")
        if given:
            raise UsageError(f"--config takes every setting from its file; {', '.join(given)} cannot be combined "
                             "with it (edit the file, or use --preset)")
        from latentcode.models.config import ConfigError
        from latentcode.training.config import TrainConfig

        args.config_data = read_json_file(args.config, "--config")
        try:
            TrainConfig.check_fields(args.config_data)
        except ConfigError as error:  # it says what is wrong, not in which file
            raise UsageError(f"--config {args.config}: {error}") from None
    elif args.preset:
        if args.preset not in presets():
            raise UsageError(f"unknown preset {args.preset!r}; valid presets: {', '.join(presets())}")
        if args.scale not in SCALES:
            raise UsageError(f"--scale {args.scale}: unknown scale; valid scales: {', '.join(SCALES)}")
        variants = task_class(presets()[args.preset].task["name"]).variants
        if args.variant is not None and args.variant not in variants:
            raise UsageError(f"--variant {args.variant}: not a variant of the {args.preset} task; valid variants: "
                             f"{', '.join(variants)}")
        known = TRAIN_FIELDS | MODEL_FIELDS | task_fields()
        for key, value in parse_assignments(args.set, "--set").items():
            if key not in known:
                raise UsageError(f"--set {key}={value}: unknown field {key!r}; valid fields: {', '.join(sorted(known))}")
    else:
        raise UsageError("latentcode train needs --preset (fuzzy_logic, sraven or language), --config or --resume")
    if args.out:
        check_output(args.out, "--out", kind="directory")


def _run_train(args: argparse.Namespace) -> None:
    from latentcode.models.config import ConfigError
    from latentcode.training import TrainConfig, build_train_config, train

    on_step = _choose_threads(args.threads)

    if args.resume:
        run = train(resume=args.resume, progress=not args.quiet, on_step=on_step)
    else:
        if args.config:
            try:
                config = TrainConfig.from_dict(args.config_data)
            except ConfigError as error:  # it says what is wrong, not in which file
                raise UsageError(f"--config {args.config}: {error}") from None
        else:
            overrides = {field: getattr(args, field) for _, field, _, _ in TRAIN_OVERRIDES
                         if getattr(args, field) is not None}
            overrides |= parse_assignments(args.set, "--set") | ({"compile": True} if args.compile else {})
            config = build_train_config(args.preset, args.scale, args.attention, **overrides)
        out = args.out or check_output(f"runs/{config.preset or config.task['name']}-"
                                       f"{config.model_config().attention_name}-{config.scale}-seed{config.seed}",
                                       "--out", kind="directory")
        run = train(config, out, progress=not args.quiet, on_step=on_step)
    if int(os.environ.get("RANK", "0")) != 0:
        return  # one report per run, from the main process of a multi-process launch
    summary = run.summary or {}
    print(f"run finished: {run.path}  ({summary.get('steps')} steps, {summary.get('wall_seconds', 0):.0f} s)")
    for split, metrics in (summary.get("final_metrics") or {}).items():
        print(f"  {split:14s} " + "  ".join(f"{key} {value:.4f}" for key, value in metrics.items()))


def _choose_threads(threads: int | None):
    """--threads sets this process's CPU threads. Without it (and without OMP_NUM_THREADS), measure
    how busy the cores are before training starts, and return an `on_step` that says so in one line
    at the first step where other processes already keep them busy (see training/threads.py): at
    the first step, so that a run refused before it starts (a held lock, a finished run) prints
    only its error."""
    import torch

    from latentcode.training.threads import busy_cores_elsewhere, contention_note

    if threads is not None:
        torch.set_num_threads(threads)
        return None
    if "OMP_NUM_THREADS" in os.environ or int(os.environ.get("RANK", "0")) != 0:
        return None
    note = contention_note(torch.get_num_threads(), busy_cores_elsewhere())
    if note is None:
        return None

    said = False

    def say_once(step: int, loss: float) -> None:
        nonlocal said
        if not said:
            print(note, file=sys.stderr, flush=True)
            said = True

    return say_once


# -- latentcode sweep -------------------------------------------------------------------------------
@subcommand
def _sweep(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="train a grid of runs and tabulate them",
        description="Run a grid of training runs (learning rate, weight decay, warmup, seeds, attention presets, "
        "depth, width, data size, ...) sequentially or as independent processes; write results.csv/json and "
        "best.json (chosen on the in-distribution test split, never on OOD).",
        epilog="example:\n  latentcode sweep --preset fuzzy_logic --scale tiny --grid attention=softmax,linear,hyla "
        "--grid learning_rate=1e-3,3e-3 --seeds 0,1 --out sweeps/fuzzy\n  latentcode sweep --preset sraven --grid paper "
        "--out sweeps/sraven-paper",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", required=True)
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--out", required=True, help="sweep directory (one run directory per grid point)")
    parser.add_argument("--grid", action="append", metavar="FIELD=V1,V2,...",
                        help="values of one field (any train/model/task field, or attention); 'paper' adds the "
                        "paper's grid for the preset")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds (default 0)")
    parser.add_argument("--jobs", type=POSITIVE_INTEGER, default=1,
                        help="runs at a time, each in its own process (default 1)")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_sweep)


@checks("sweep")
def _check_sweep(args: argparse.Namespace) -> None:
    """The preset, scale, grid and seeds (each grid value is checked by `sweep`, before any run)."""
    from latentcode.training.presets import MODEL_FIELDS, SCALES, TRAIN_FIELDS, presets, task_fields

    if args.preset not in presets():
        raise UsageError(f"--preset {args.preset}: unknown preset; valid presets: {', '.join(presets())}")
    if args.scale not in SCALES:
        raise UsageError(f"--scale {args.scale}: unknown scale; valid scales: {', '.join(SCALES)}")
    grid: dict = {}
    known = TRAIN_FIELDS | MODEL_FIELDS | task_fields()
    for item in args.grid or []:
        if item == "paper":
            grid |= {key: list(values) for key, values in presets()[args.preset].paper_grid.items()}
            continue
        key, separator, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not separator:
            raise UsageError(f"--grid expects FIELD=V1,V2,... or 'paper', got {item!r}")
        if key not in known:
            raise UsageError(f"--grid {item}: unknown field {key!r}; valid fields: {', '.join(sorted(known))}")
        grid[key] = [parse_value(value) for value in values.split(",") if value]
        if not grid[key]:
            raise UsageError(f"--grid {item}: no values after '='; expected FIELD=V1,V2,...")
    try:
        args.seed_list = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    except ValueError:
        args.seed_list = []
    if not args.seed_list or min(args.seed_list) < 0 or max(args.seed_list) >= SEED_LIMIT:
        raise UsageError(f"--seeds {args.seeds}: expected comma-separated non-negative integers below {SEED_LIMIT}, "
                         "e.g. 0,1,2")
    args.grid_values = grid
    check_output(args.out, "--out", kind="directory")


def _run_sweep(args: argparse.Namespace) -> None:
    from latentcode.training.sweeps import best_runs, sweep

    grid = args.grid_values
    rows = sweep(args.preset, args.scale, grid, args.out, seeds=args.seed_list, jobs=args.jobs,
                 progress=not args.quiet)
    print(f"{len(rows)} runs; table: {args.out}/results.csv")
    for attention, row in best_runs(rows, args.preset).items():
        params = {k: v for k, v in row.items() if k in grid or k == "seed"}
        print(f"  best {attention}: {params}  " + "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k.startswith(("test.", "ood.")) and isinstance(v, float)))


# -- latentcode extract -----------------------------------------------------------------------------
@subcommand
def _extract(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "extract",
        help="record latent codes of a trained model into an HDF5 file",
        description="Run a trained model on task instances and record the latent codes a[:, q, k] at the selected "
        "sites, with every task label, the prediction and the target, into a self-describing HDF5 file (schema: "
        "latentcode/store.py). Written atomically: an interrupted extraction leaves no file behind.",
        epilog="site selectors: last-self (every layer, last token to itself), sraven-rule (every layer, last query "
        "token to the same feature in the last row's context panels; unpermuted instances), all-pairs:LAYER, or "
        "LAYER:QUERY:KEY[,...] (negative positions count from the end, * as LAYER is every layer)\n\nexample:\n"
        "  latentcode extract runs/sraven-hyla --split ood --n 8192 --sites sraven-rule --out codes.h5\n\n"
        "sharded, one shard per process (codes.shard-RANK-of-2.h5), codes.h5 presenting them as one file:\n"
        "  torchrun --standalone --nproc_per_node 2 -m latentcode.cli -- extract runs/sraven-hyla --n 8192 --out codes.h5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN_DIR", help="a run directory (or a saved model directory with --task)")
    parser.add_argument("--split", help="task split (default: the task's held-out split, ood; validation for "
                        "language)")
    parser.add_argument("--n", type=int, default=8192, help="instances (default 8192)")
    parser.add_argument("--sites", default="last-self", help="site selector (default last-self)")
    parser.add_argument("--out", required=True, help="the HDF5 file to write")
    parser.add_argument("--variant", help="task variant (default: the selector's, else the task's default)")
    parser.add_argument("--score", choices=("pattern", "scores"), default="pattern",
                        help="pattern: normalized latent codes (default); scores: raw scores before normalization")
    parser.add_argument("--batch-size", type=int, default=256, help="instances per forward pass (default 256)")
    parser.add_argument("--seed", type=int, help="sample seed (default: the split's evaluation seed)")
    parser.add_argument("--task", metavar="KEY=VALUE", action="append",
                        help="task config for a model directory, e.g. --task name=sraven --task n_features=4")
    parser.add_argument("--append", action="store_true", help="add examples to an existing file with the same schema")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")
    parser.add_argument("--compression", choices=("gzip", "lzf", "none"), default="gzip",
                        help="of a new file: gzip (default; h5dump and every HDF5 tool read it), lzf (h5py only), none")
    parser.add_argument("--wait-for-lock", type=NON_NEGATIVE_NUMBER, default=0.0, metavar="SECONDS",
                        help="wait this long while another process writes --out (default: refuse at once)")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_extract)


@checks("extract")
def _check_extract(args: argparse.Namespace) -> None:
    """The model, its task, the split, the variant and the output, before torch is imported."""
    from latentcode.rundir import WEIGHTS_FILE, RunDirectory, RunRecord

    for flag, value, minimum in (("--n", args.n, 1), ("--batch-size", args.batch_size, 1), ("--seed", args.seed, 0)):
        if value is not None and value < minimum:
            kind = "a positive integer" if minimum else "a non-negative integer"
            raise UsageError(f"argument {flag}: expected {kind}, got {value}")
    if args.seed is not None and args.seed >= SEED_LIMIT:
        raise UsageError(f"argument --seed: expected a non-negative integer below {SEED_LIMIT}, got {args.seed}")
    run = Path(args.run)
    task = parse_assignments(args.task, "--task")
    if RunDirectory(run).looks_like_a_run():
        task = task or RunRecord.read(run).task_config
    elif not (run / WEIGHTS_FILE).is_file():
        raise UsageError(f"RUN_DIR {run} is neither a finished run directory (with model/{WEIGHTS_FILE}) nor a "
                         f"model directory (with {WEIGHTS_FILE}){'' if run.exists() else ': it does not exist'}")
    elif not task:
        raise UsageError(f"{run} is a model directory without its run: give its task with --task, "
                         "e.g. --task name=sraven")
    from latentcode.tasks import get_task

    task_object = get_task(**task)
    args.split = args.split or task_object.analysis.held_out_split
    if args.split not in task_object.splits:
        raise UsageError(f"--split: unknown split {args.split!r} for task {task_object.name!r}; "
                         f"valid splits: {list(task_object.splits)}")
    if args.variant is not None and args.variant not in task_object.variants:
        raise UsageError(f"--variant: unknown variant {args.variant!r} for task {task_object.name!r}; "
                         f"valid variants: {list(task_object.variants)}")
    from latentcode.extraction.sites import MAX_ALL_PAIRS, parse_selector

    model_config = _model_config_of(run)
    sites = parse_selector(args.sites, task_object).resolve(model_config["n_layers"], task_object.seq_len)
    if len(sites) > MAX_ALL_PAIRS:
        raise UsageError(f"--sites {args.sites!r} selects {len(sites)} sites; a codes file holds one dataset per site, "
                         f"at most {MAX_ALL_PAIRS}: select fewer (a layer, a row, a block), or sweep them with "
                         "latentcode patch")
    batch = min(args.batch_size, args.n)
    n_heads = int(model_config.get("n_heads") or 1)
    check_fits_in_memory(forward_pass_bytes(batch, task_object.seq_len, model_config) + 4 * batch * len(sites) * n_heads,
                         f"a forward pass of {batch} sequences of {task_object.seq_len} (the smaller of --n and "
                         "--batch-size)")
    out = check_output(args.out, "--out")
    check_fits_on_disk(4 * args.n * len(sites) * n_heads, out, args.compression,
                       f"--n {args.n} x {len(sites)} sites x {n_heads} heads of float32 codes")
    if args.append and args.overwrite:
        raise UsageError("--append adds to --out and --overwrite replaces it: give one of them")
    if out.exists() and not (args.append or args.overwrite):
        raise FileExistsError(f"--out {out} already exists; add --append to add examples to it, --overwrite to "
                              "replace it, or choose another --out")
    if out.exists() and args.append:
        open_codes_files([out], "--out")  # a damaged file or one that is no codes file is refused now


def _run_extract(args: argparse.Namespace) -> None:
    from latentcode.extraction import extract
    from latentcode.store import CodeFile

    task = parse_assignments(args.task, "--task") or None
    path = extract(args.run, task, args.sites, args.split, args.n, args.out, variant=args.variant, score=args.score,
                   batch_size=args.batch_size, seed=args.seed, append=args.append, overwrite=args.overwrite,
                   progress=progress_bars(args), compression=args.compression, wait_for_lock=args.wait_for_lock)
    if os.environ.get("RANK", "0") != "0":  # a sharded extraction (torchrun, accelerate launch): rank 0 says it
        return
    codes = CodeFile(path)
    print(f"wrote {path}: {len(codes)} examples (splits {codes.splits}), {len(codes.sites)} sites, "
          f"{codes.n_heads} heads, labels {codes.label_names}"
          + (f", rows in {len(codes.shards)} shards beside it" if codes.shards else ""))


# -- latentcode intervene ---------------------------------------------------------------------------
@subcommand
def _intervene(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "intervene",
        help="edit latent codes of a trained model and measure the task metric before/after",
        description="Run a trained model on task instances with its latent codes a[:, q, k] edited at the selected "
        "sites (after the score normalization, before the value network), at all sites together and at each site "
        "alone, and write the task metrics without and with the edit as a tidy table (.csv, .json) and a plot.",
        epilog="operations (one of): --zero-ablate HEADS, --mean-ablate HEADS --codes FILE [--by LABEL], "
        "--set V1,V2,... / --add V1,V2,... (one value per head) or --scale FACTOR, optionally with --heads HEADS; "
        "HEADS is 'all' or a list such as 0,3,5\n\nexample:\n  latentcode extract runs/sraven-hyla --split train "
        "--n 4096 --sites sraven-rule --out codes.h5\n  latentcode intervene runs/sraven-hyla --sites sraven-rule "
        "--mean-ablate all --codes codes.h5 --by rule --out results/mean-ablate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN_DIR", help="a run directory (or a saved model directory with --task)")
    parser.add_argument("--sites", default="last-self", help="site selector, as for extract (default last-self)")
    parser.add_argument("--split", help="task split (default: the task's held-out split, ood; validation for "
                        "language)")
    parser.add_argument("--n", type=int, default=1024, help="instances (default 1024)")
    operation = parser.add_mutually_exclusive_group(required=True)
    operation.add_argument("--zero-ablate", metavar="HEADS", help="set the codes of these heads to zero")
    operation.add_argument("--mean-ablate", metavar="HEADS", help="set the codes of these heads to their mean in --codes")
    operation.add_argument("--set", metavar="VECTOR", help="set the codes to this vector (one value per head)")
    operation.add_argument("--add", metavar="VECTOR", help="add this vector to the codes (steering)")
    operation.add_argument("--scale", type=finite_number, metavar="FACTOR", help="multiply the codes by FACTOR")
    parser.add_argument("--heads", metavar="HEADS", help="heads --set/--add/--scale change (default all)")
    parser.add_argument("--codes", metavar="CODES.h5", help="codes file of this model for --mean-ablate")
    parser.add_argument("--by", metavar="LABEL", help="--mean-ablate with one mean per value of this label")
    parser.add_argument("--codes-split", help="take the means over this split of --codes (default all examples)")
    parser.add_argument("--out", required=True, help="path stem of the table (.csv, .json) and the plot")
    parser.add_argument("--variant", help="task variant (default: the selector's, else the task's default)")
    parser.add_argument("--batch-size", type=int, default=256, help="instances per forward pass (default 256)")
    parser.add_argument("--seed", type=SEED, help="sample seed (default: the split's evaluation seed)")
    parser.add_argument("--task", metavar="KEY=VALUE", action="append",
                        help="task config for a model directory, e.g. --task name=sraven --task n_features=4")
    parser.add_argument("--no-per-site", action="store_true", help="only all sites together, not each site alone")
    parser.add_argument("--format", action="append", choices=("png", "svg", "pdf"), help="plot formats (default png)")
    parser.add_argument("--overwrite", action="store_true", help="replace the table and plot if --out has them")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_intervene)


def _parse_heads(text: str | None, flag: str) -> list[int] | None:
    """'all' (or nothing) -> None; '0,3,5' -> [0, 3, 5]."""
    if text is None or text.strip() == "all":
        return None
    try:
        heads = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag} expects 'all' or head indices such as 0,3,5; got {text!r}") from None
    if not heads or min(heads) < 0:
        raise UsageError(f"{flag} expects 'all' or non-negative head indices such as 0,3,5; got {text!r}")
    return heads


def _parse_vector(text: str, flag: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag} expects comma-separated numbers, one per head (e.g. 0.5,0,1.2); got {text!r}") from None
    if not all(math.isfinite(value) for value in values):
        raise UsageError(f"{flag} expects finite numbers, one per head (e.g. 0.5,0,1.2); got {text!r}")
    return values


MAX_PER_SITE_SCOPES = 64  # intervene's per-site scopes, one pass over the instances each


def _model_config_of(path: Path) -> dict:
    """The model config of a run directory or a saved model directory, from JSON (no torch)."""
    from latentcode.rundir import RunDirectory, RunRecord

    if path.is_dir() and RunDirectory(path).looks_like_a_run():
        config = RunRecord.read(path).config
        model_config = config.get("resolved_model_config") or config["train"]["model"]
    else:
        model_config = read_json_file(str(path / "config.json"), "RUN_DIR")
    if not isinstance(model_config, dict) or not isinstance(model_config.get("n_layers"), int):
        raise UsageError(f"RUN_DIR {path}: its model config names no number of layers (n_layers)")
    return model_config


@checks("intervene")
def _check_intervene(args: argparse.Namespace) -> None:
    """The model, its task, the split, the variant and the sites, from JSON and the task module (no
    torch), so that a mistake is answered at once (issue 22: it took ~10 s)."""
    from latentcode.extraction.sites import parse_selector
    from latentcode.rundir import RunDirectory, RunRecord
    from latentcode.tasks import get_task

    path = Path(args.run)
    overrides = parse_assignments(args.task, "--task")
    if path.is_dir() and RunDirectory(path).looks_like_a_run():
        record = RunRecord.read(path)
        model_config = _model_config_of(path)
        task_config = {**record.task_config, **overrides} if overrides else dict(record.task_config)
    elif (path / "model.safetensors").is_file() and (path / "config.json").is_file():
        model_config = _model_config_of(path)
        if not overrides:
            raise UsageError(f"{path} is a model directory without a task; give it with --task name=... (e.g. --task "
                             "name=sraven --task n_features=4)")
        task_config = overrides
    else:
        raise UsageError(f"RUN_DIR {path} is neither a finished run directory (with model/model.safetensors) nor a "
                         "model directory (with model.safetensors)")
    task = get_task(**task_config)
    split = task.analysis.held_out_split if args.split is None else args.split
    if split not in task.splits:
        raise UsageError(f"--split {split!r}: task {task.name!r} has the splits {list(task.splits)}")
    if args.variant is not None and args.variant not in task.variants:
        raise UsageError(f"--variant {args.variant!r}: task {task.name!r} has the variants {list(task.variants)}")
    sites = parse_selector(args.sites, task).resolve(model_config["n_layers"], task.seq_len)
    for flag, value in (("--n", args.n), ("--batch-size", args.batch_size)):
        if value < 1:
            raise UsageError(f"argument {flag}: expected a positive integer, got {value}")
    # Every instance is sampled before the first pass ([n, sequence, d_in]), then passes of a batch each.
    inputs = 4 * args.n * task.seq_len * int(model_config.get("d_in") or 1)
    check_fits_in_memory(inputs + forward_pass_bytes(min(args.batch_size, args.n), task.seq_len, model_config),
                         f"--n {args.n} instances (sequences of {task.seq_len}) in passes of --batch-size "
                         f"{min(args.batch_size, args.n)}")
    if len(sites) > MAX_PER_SITE_SCOPES and not args.no_per_site:
        raise UsageError(f"--sites {args.sites!r} selects {len(sites)} sites, and intervene would measure each alone "
                         f"(more than {MAX_PER_SITE_SCOPES}); add --no-per-site to edit them together, or sweep groups "
                         "of them with latentcode patch")


def _run_intervene(args: argparse.Namespace) -> None:
    check_output(args.out, "--out", kind="stem")
    check_stem_free(args.out, (".csv", ".json", *(f".{fmt}" for fmt in _formats(args))), args.overwrite)
    if args.mean_ablate is None and (args.codes or args.by or args.codes_split):
        raise UsageError("--codes, --by and --codes-split go with --mean-ablate")
    if args.mean_ablate is not None and not args.codes:
        raise UsageError("--mean-ablate needs --codes FILE: a codes file extracted from this model (latentcode extract)")
    if args.heads is not None and (args.zero_ablate is not None or args.mean_ablate is not None):
        raise UsageError("--zero-ablate and --mean-ablate name their heads themselves; --heads goes with --set/--add/--scale")
    task = parse_assignments(args.task, "--task") or None
    heads = _parse_heads(args.heads, "--heads")
    if args.zero_ablate is not None:
        heads = _parse_heads(args.zero_ablate, "--zero-ablate")
    elif args.mean_ablate is not None:
        heads = _parse_heads(args.mean_ablate, "--mean-ablate")
    vector = None
    if args.set is not None or args.add is not None:
        vector = _parse_vector(args.set if args.set is not None else args.add, "--set" if args.set is not None else "--add")

    from latentcode.intervention import (
        AddVector,
        MeanAblate,
        ScaleHeads,
        SetCode,
        ZeroAblate,
        intervention_effects,
        write_effects,
    )

    if args.zero_ablate is not None:
        edit = ZeroAblate(heads=heads)
    elif args.mean_ablate is not None:
        edit = MeanAblate.from_codes(args.codes, heads, by=args.by, split=args.codes_split, model=args.run)
    elif args.set is not None:
        edit = SetCode(vector, heads=heads)
    elif args.add is not None:
        edit = AddVector(vector, heads=heads)
    else:
        edit = ScaleHeads(args.scale, heads=heads)
    table = intervention_effects(args.run, edit, task=task, sites=args.sites, split=args.split, n=args.n,
                                 variant=args.variant, batch_size=args.batch_size, seed=args.seed,
                                 per_site=not args.no_per_site, progress=progress_bars(args))
    import pandas

    columns = ["scope", "metric", "before", "after", "change"]
    with pandas.option_context("display.width", 200, "display.max_rows", 200):
        print(f"{table['model'].iloc[0]}, {table['edit'].iloc[0]}, {table['split'].iloc[0]} (n={args.n}):")
        print(table[columns].to_string(index=False, float_format=lambda value: f"{value:.4f}"))
    written = write_effects(table, args.out, formats=_formats(args))
    print("wrote " + ", ".join(map(str, written)))


# -- latentcode patch (latentcode/patch_command.py) -------------------------------------------------
@subcommand
def _patch(subparsers: argparse._SubParsersAction) -> None:
    from latentcode import patch_command

    patch_command.register(subparsers, integer, SEED).set_defaults(handler=patch_command.run)
    _CHECKS["patch"] = patch_command.check


# -- analysis: probe, plot, heatmap, samples, report ---------------------------------------------------
def _default_label(code_files: Sequence, label: str | None, flag: str = "--label", kind: str = "probe_label") -> str:
    """`label`, else the one the files' task analysis names (`probe_label` or `picture_label`)."""
    if label:
        return label
    labels = {code_file.task_analysis.get(kind, code_file.task_analysis.get("probe_label")) for code_file in code_files}
    if len(labels) == 1 and None not in labels:
        return labels.pop()
    tasks = sorted({str(code_file.task_config.get("name")) for code_file in code_files})
    raise UsageError(f"give {flag}: the files (tasks {tasks}) name no single label the task's analysis decodes")


@subcommand
def _probe(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "probe",
        help="decode a label from latent codes with linear probes",
        description="Fit a logistic regression (categorical or multi-hot labels; --ridge: ridge regression R^2) per "
        "layer on one split and score it on another, beside baselines (majority, prevalence-matched random, "
        "all-present for multi-hot labels, label-shuffled probe); the best layer is chosen by cross-validation on the "
        "fit split, never on the test split. Several files are compared side by side (one model each).",
        epilog="example:\n  latentcode probe softmax.h5 linear.h5 hyla.h5 --label rule --fit-split train --test-split ood "
        "--out results/rule",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", metavar="CODES.h5")
    parser.add_argument("--label", help="label to decode; name, name[i] or name[-1] (default: rule for SRAVEN, "
                        "term_present for fuzzy logic)")
    parser.add_argument("--fit-split", default="train")
    parser.add_argument("--test-split", default="ood")
    parser.add_argument("--per-site", action="store_true", help="one probe per site instead of per layer")
    parser.add_argument("--ridge", action="store_true", help="ridge regression R^2 (continuous or multi-hot labels)")
    parser.add_argument("--cv", type=integer(2), default=3, help="cross-validation folds on the fit split (default 3)")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--out", help="path stem for the table (.csv, .json) and the plot (.png); default: print only")
    parser.add_argument("--format", action="append", choices=("png", "svg", "pdf"), help="plot formats (default png)")
    parser.add_argument("--overwrite", action="store_true", help="replace the table and plot if --out has them")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_run_probe)


@checks("probe")
def _check_probe(args: argparse.Namespace) -> None:
    code_files = open_codes_files(args.files)
    from latentcode.provenance import check_one_task

    check_one_task(code_files)  # one label decoded in files of different tasks means different things
    args.label = _default_label(code_files, args.label)
    for code_file in code_files:
        check_splits(code_file, {"--fit-split": args.fit_split, "--test-split": args.test_split})
        check_label(code_file, args.label, "--label")
        check_decodable(code_file, args.label, "--label", args.fit_split)
    if args.out:
        check_output(args.out, "--out", kind="stem")
        check_stem_free(args.out, (".csv", ".json", *(f".{fmt}" for fmt in _formats(args))), args.overwrite)


def _run_probe(args: argparse.Namespace) -> None:
    from latentcode.analysis import (
        decode,
        headline_lines,
        plot_probe_scores,
        regress,
        summary_rows,
        write_table,
    )

    label = args.label
    probe = regress if args.ridge else decode
    table = probe(args.files, label, fit_split=args.fit_split, test_split=args.test_split, per_site=args.per_site,
                  cv=args.cv, seed=args.seed, progress=progress_bars(args))
    columns = ["model", "layer", "site", "label", "metric", "value", "validation", "selected", "strongest_baseline",
               "strongest_baseline_value", "beats_baselines", "n_fit", "n_test"]
    import pandas

    with pandas.option_context("display.width", 250, "display.max_rows", 200):
        print(summary_rows(table)[columns].to_string(index=False, float_format=lambda value: f"{value:.3f}"))
    print("\n".join(headline_lines(table)))
    if args.out:
        suffixes = (".csv", ".json", *(f".{fmt}" for fmt in _formats(args)))
        with _command_outputs(args.out, suffixes, args.overwrite, "latentcode probe") as outputs:
            write_table(table, args.out)  # both join the command's set: the table and plot, or nothing
            plot_probe_scores(table, args.out, formats=_formats(args))
        print("wrote " + ", ".join(map(str, outputs.written)))


def _add_picture_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="CODES.h5")
    parser.add_argument("--split", help="only this split (default: all)")
    parser.add_argument("--out", help="path stem of the figure (default: next to the file)")
    parser.add_argument("--format", action="append", choices=("png", "svg", "pdf"), help="default png; repeatable")
    parser.add_argument("--overwrite", action="store_true", help="replace the figure if it exists")


def _check_picture(args: argparse.Namespace, flag: str, kind: str) -> None:
    """The file, the label (`args.label`, flag `flag`), the split, the layer and the figure's path
    (`kind` names it: FILE_<kind>_<label>); fills in the defaults."""
    [code_file] = open_codes_files([args.file])
    args.label = _default_label([code_file], args.label, flag, kind="picture_label")
    check_splits(code_file, {"--split": args.split})
    check_label(code_file, args.label, flag)
    if getattr(args, "layer", None) is not None and args.layer not in code_file.layers:
        raise UsageError(f"--layer {args.layer}: {args.file} has no layer {args.layer}; its layers are {code_file.layers}")
    args.out = args.out or str(Path(args.file).with_suffix("")) + f"_{kind}_{_label_name(args.label)}"
    check_output(args.out, "--out", kind="stem")
    check_stem_free(args.out, tuple(f".{fmt}" for fmt in _formats(args)), args.overwrite)


def _draw(args: argparse.Namespace, function: str, **options) -> None:
    """Draw with `latentcode.analysis.<function>(file, label, path_stem, split, formats, **options)`."""
    import importlib

    draw = getattr(importlib.import_module("latentcode.analysis"), function)
    with _command_outputs(args.out, tuple(f".{fmt}" for fmt in _formats(args)), args.overwrite,
                          f"latentcode {args.command}") as outputs:
        draw(args.file, args.label, args.out, split=args.split, formats=_formats(args), **options)
    print("wrote " + ", ".join(map(str, outputs.written)))


@subcommand
def _plot(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plot", help="tSNE or UMAP of latent codes, one panel per layer, coloured by a label",
        description="Embed the latent codes of each layer with tSNE or UMAP (fixed seed; at most --max-points "
        "examples, subsampled with the seed) and colour them by a label.",
    )
    _add_picture_arguments(parser)
    parser.add_argument("--method", choices=("tsne", "umap"), default="tsne")
    parser.add_argument("--color", dest="label", help="label to colour by (default: the task's sub-task label)")
    parser.add_argument("--max-points", type=POSITIVE_INTEGER, default=2000, help="subsampling cap (default 2000)")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.set_defaults(handler=lambda args: _draw(
        args, "plot_embedding", method=args.method, max_points=args.max_points, seed=args.seed))


checks("plot")(lambda args: _check_picture(args, "--color", args.method))


@subcommand
def _heatmap(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "heatmap", help="cosine similarity between the mean latent code of each label value",
        description="Cosine similarity between the mean latent code of each value of a label (the paper's "
        "rule-by-rule heatmap), rows ordered by hierarchical clustering, values annotated; one panel per layer.",
    )
    _add_picture_arguments(parser)
    parser.add_argument("--label", help="categorical label (default: rule for SRAVEN)")
    parser.add_argument("--centre", choices=("auto", "yes", "no"), default="auto",
                        help="subtract the grand mean code before the cosine (diverging scale -1..1); auto (default): "
                        "where the plain cosines of most panels all lie close to 1, and the title says so")
    parser.set_defaults(handler=lambda args: _draw(
        args, "plot_similarity", centre={"auto": None, "yes": True, "no": False}[args.centre]))


checks("heatmap")(lambda args: _check_picture(args, "--label", "similarity"))


@subcommand
def _samples(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("samples", help="a grid of raw latent-code samples per label value")
    _add_picture_arguments(parser)
    parser.add_argument("--label", help="integer label (default: rule for SRAVEN)")
    parser.add_argument("--layer", type=int, help="layer (default: the last)")
    parser.set_defaults(handler=lambda args: _draw(args, "plot_code_samples", layer=args.layer))


checks("samples")(lambda args: _check_picture(args, "--label", "samples"))


@subcommand
def _report(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report", help="one offline HTML page: training curves, metrics, probe tables and plots",
        description="Write one self-contained HTML page (no JavaScript) for one or several runs: training curves, "
        "final metrics per split, probe tables and figures for their codes files (RUN_DIR/codes/*.h5, or --codes).",
    )
    parser.add_argument("runs", nargs="*", metavar="RUN_DIR")
    parser.add_argument("--codes", action="append", metavar="CODES.h5", help="codes files (default: RUN_DIR/codes/*.h5)")
    parser.add_argument("--label", help="label to decode and colour by (default: the task's sub-task label)")
    parser.add_argument("--fit-split", default="train")
    parser.add_argument("--test-split", default="ood")
    parser.add_argument("--method", action="append", choices=("tsne", "umap"), help="embeddings to draw (default tsne)")
    parser.add_argument("--max-points", type=POSITIVE_INTEGER, default=1000)
    parser.add_argument("--title", default="latentcode report")
    parser.add_argument("--patch", action="append", metavar="STEM", help="outputs of latentcode patch (STEM.csv, "
                        "STEM.json, STEM.png) to show in an Interventions section (repeatable)")
    parser.add_argument("--out", default="report.html", help="the HTML page to write (default report.html; a name "
                        "without .html gets it); its figures and tables go beside it, in NAME_files/")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_report)


@checks("report")
def _check_report(args: argparse.Namespace) -> None:
    """Runs and codes files that belong together, a label they all have, an output to write."""
    if not args.runs and not args.codes:
        raise UsageError("latentcode report needs RUN_DIR arguments, --codes files, or both")
    for run in args.runs:
        if not Path(run).exists():
            raise FileNotFoundError(f"RUN_DIR {run} does not exist")
    for path in args.codes or ():
        check_input_file(path, "--codes")
    for stem in args.patch or ():
        for suffix in (".csv", ".json"):
            check_input_file(f"{stem}{suffix}", "--patch")
    from latentcode.provenance import check_codes_from_runs, check_one_task, codes_of_runs
    from latentcode.rundir import RunRecord

    runs = [RunRecord.read(run) for run in args.runs]
    code_files = open_codes_files(args.codes, "--codes") if args.codes else open_codes_files(codes_of_runs(runs))
    check_one_task(code_files, runs)
    check_codes_from_runs(runs, code_files)
    if code_files:
        label = _default_label(code_files, args.label)
        for code_file in code_files:
            check_label(code_file, label, "--label")
    if Path(args.out).suffix.lower() not in (".html", ".htm") and not Path(args.out).is_dir():
        args.out += ".html"  # as build_report names it: a page a browser opens
    out = check_output(args.out, "--out")
    if out.exists() and not args.overwrite:
        raise FileExistsError(f"--out {out} already exists; add --overwrite to replace it, or choose another --out")
    files_dir = out.with_name(f"{out.stem}_files")  # the report's figures and tables
    if files_dir.is_dir() and any(files_dir.iterdir()) and not args.overwrite:
        raise FileExistsError(f"--out {out}: {files_dir} already holds files; add --overwrite to replace the "
                              "report's files in it, or choose another --out")


def _run_report(args: argparse.Namespace) -> None:
    from latentcode.analysis.report import build_report

    report = build_report(args.runs, args.codes or (), args.out, label=args.label, fit_split=args.fit_split,
                          test_split=args.test_split, methods=tuple(args.method or ["tsne"]),
                          max_points=args.max_points, title=args.title, overwrite=args.overwrite,
                          progress=progress_bars(args), patches=args.patch or ())
    print(f"report: {report.path.resolve()}")
    for line in report.headline():
        print("  " + line)


# -- latentcode demo -------------------------------------------------------------------------------
@subcommand
def _demo(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the main job: models, latent codes, decoding, plots and a report, in a few minutes",
        description="Take softmax, linear and HYLA models (the checkpoints shipped in models/, or --train new ones), "
        "extract their latent codes on in-distribution and OOD tasks (language: training and validation text), decode "
        "the sub-task (SRAVEN rule / fuzzy-logic terms / the class of the query byte), draw tSNE plots and the "
        "mean-code heatmap, write an HTML report and print the headline numbers.",
    )
    parser.add_argument("--task", default=None,
                        help="fuzzy_logic (default), sraven or language; each starts from the checkpoints shipped in "
                        "models/")
    parser.add_argument("--train", action="store_true", help="train the models here instead of using the shipped ones")
    parser.add_argument("--models", metavar="DIR", help="the directory of the shipped checkpoints (default: found "
                        "beside the source, or installed with the package; or $LATENTCODE_MODELS)")
    parser.add_argument("--checkpoints", help="another shipped trio of the task: 'permuted' (SRAVEN models trained on "
                        "the paper's permuted task, M=2 features; the default trio is trained on the unpermuted one)")
    parser.add_argument("--scale", default="demo", help="training scale with --train (tiny, demo, cpu; default demo)")
    parser.add_argument("--out", default="latentcode-demo", help="output directory (a new one if it exists)")
    parser.add_argument("--n-codes", type=POSITIVE_INTEGER, default=2048,
                        help="instances per split to extract (default 2048)")
    parser.add_argument("--quiet", action="store_true")
    parser.set_defaults(handler=_run_demo)


@checks("demo")
def _check_demo(args: argparse.Namespace) -> None:
    from latentcode.shipped import (
        MODELS_ENV,
        SHIPPED_ATTENTIONS,
        find_models_directory,
        missing_checkpoints,
        searched,
    )
    from latentcode.tasks import DEMO_TASK, task_class, task_names

    args.task = args.task or DEMO_TASK
    demo_tasks = [name for name in task_names() if task_class(name).training_setup is not None]
    if args.task not in demo_tasks:
        raise UsageError(f"--task {args.task}: unknown demo task; choose one of {demo_tasks}")
    if args.train and args.checkpoints:
        raise UsageError(f"--checkpoints {args.checkpoints} picks shipped models and --train trains new ones: give one")
    if args.train:
        from latentcode.training.presets import SCALES

        if args.scale not in SCALES:
            raise UsageError(f"--scale {args.scale}: unknown scale; valid scales: {', '.join(SCALES)}")
    else:
        directory = find_models_directory(args.models)
        if directory is None:
            raise UsageError(f"the shipped checkpoints are not installed (looked in: {searched()}); pass --models DIR "
                             f"(the models/ directory of a latentcode checkout) or set {MODELS_ENV}, or add --train")
        where = f"--models {args.models}" if args.models else f"{MODELS_ENV}={directory}" if os.environ.get(
            MODELS_ENV) else str(directory)
        if not directory.is_dir():
            raise UsageError(f"{where} is not a directory; expected the directory of the shipped checkpoints")
        missing = missing_checkpoints(directory, args.task, SHIPPED_ATTENTIONS, args.checkpoints)
        if missing:
            others = sorted({path.name.split("-")[1] for path in directory.glob(f"{args.task}-*-hyla")})
            if not args.checkpoints:
                hint = "pass --models DIR holding them, or add --train to train new ones"
            elif others:
                hint = f"--checkpoints takes one of {others} for --task {args.task}"
            else:
                hint = f"{where} ships no other trio of --task {args.task}: leave out --checkpoints"
            raise UsageError(f"{where} lacks the shipped checkpoints {missing} (<name>/model/model.safetensors); {hint}")
        args.models = directory
    check_output(args.out, "--out", kind="stem")


def _run_demo(args: argparse.Namespace) -> None:
    from latentcode.demo import run_demo

    run_demo(task=args.task, out=args.out, train=args.train, scale=args.scale, n_codes=args.n_codes,
             progress=not args.quiet, models_dir=None if args.train else args.models, checkpoints=args.checkpoints)


# -- entry point ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from latentcode import __version__

    parser = CommandLineParser(
        prog="latentcode",
        description="Mechanistic interpretability of attention latent codes: train softmax, linear "
        "and HYLA transformers on compositional tasks, extract latent codes with hooks into HDF5, "
        "decode them with probes and draw them.",
    )
    parser.add_argument("--version", action="version", version=f"latentcode {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in _SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit status (2: a user error, printed as one line; argparse's
    own errors exit with 2 as well)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check = _CHECKS.get(args.command)
        if check is not None:
            check(args)
        status = args.handler(args)
    except USER_ERRORS as error:
        if os.environ.get("LATENTCODE_DEBUG"):
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
