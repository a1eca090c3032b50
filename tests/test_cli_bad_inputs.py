"""Every user mistake on the command line is answered with one line, `error: ...`, exit status 2,
naming what was wrong, and leaves everything that was already there as it was (issue 14 item 4).

Each row of BAD_INPUTS runs `latentcode.cli.main` in a workspace of real inputs (a shipped run,
codes files good and broken, configs, a file where a directory is expected, an immutable
directory, a read-only file system) and checks the message and that the workspace is unchanged,
byte for byte, with no file added.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

from latentcode.cli import main
from latentcode.store import CodeWriter, Site
from latentcode.training.presets import presets

MODELS = Path(__file__).resolve().parents[1] / "models"
SITES = [Site(0, 31, 31), Site(1, 31, 31)]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_codes(path: Path, task_config: dict, analysis: dict, labels: dict, checkpoint: str, model_name: str,
                n_per_split: int = 30) -> Path:
    """A small codes file written with the store's writer: random codes, the given labels."""
    rng = np.random.default_rng(0)
    metadata = {"model_name": model_name, "model_config": {"attention": model_name}, "checkpoint_sha256": checkpoint,
                "task_config": task_config, "task_analysis": analysis, "seed": 0}
    with CodeWriter(path, SITES, 4, metadata) as writer:
        for split in ("train", "ood"):
            writer.append(codes={site: rng.normal(size=(n_per_split, 4)) for site in SITES},
                          labels={name: make(rng, n_per_split) for name, make in labels.items()}, split=split)
    return path


FUZZY_ANALYSIS = {"probe_label": "term_present", "picture_label": "task_index", "selector": "last-self",
                  "variant": "fixed_query", "headline_metric": "r2"}
SRAVEN_ANALYSIS = {"probe_label": "rule", "picture_label": "rule", "selector": "sraven-rule",
                   "variant": "unpermuted", "headline_metric": "accuracy"}
FUZZY_LABELS = {"term_present": lambda rng, n: rng.integers(0, 2, size=(n, 6)),
                "task_index": lambda rng, n: rng.integers(0, 5, size=n)}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Inputs good and bad, made once; every row must leave them exactly as they are."""
    root = tmp_path_factory.mktemp("workspace")
    run = root / "run"
    shutil.copytree(MODELS / "fuzzy_logic-hyla", run, ignore=shutil.ignore_patterns("*.md"))
    run_task = json.loads((run / "config.json").read_text())["train"]["task"]
    run_checkpoint = sha256(run / "model" / "model.safetensors")
    sraven_checkpoint = sha256(MODELS / "sraven-hyla" / "model" / "model.safetensors")
    shutil.copytree(run / "model", root / "model_only")

    fuzzy = write_codes(root / "fuzzy.h5", run_task, FUZZY_ANALYSIS, FUZZY_LABELS, run_checkpoint, "hyla")
    softmax_checkpoint = sha256(MODELS / "fuzzy_logic-softmax" / "model" / "model.safetensors")
    write_codes(root / "fuzzy_softmax.h5", run_task, FUZZY_ANALYSIS, FUZZY_LABELS, softmax_checkpoint, "softmax")
    (root / "softmax_checkpoint").write_text(softmax_checkpoint[:12])
    (root / "run_checkpoint").write_text(run_checkpoint[:12])
    write_codes(root / "fuzzy_other_task.h5", {**run_task, "frac_test": 0.5}, FUZZY_ANALYSIS, FUZZY_LABELS,
                run_checkpoint, "hyla")
    write_codes(root / "sraven.h5", {"name": "sraven", "n_features": 4, "n_values": 8, "frac_ood": 0.25, "seed": 0},
                SRAVEN_ANALYSIS, {"rule": lambda rng, n: rng.integers(0, 8, size=n)}, sraven_checkpoint, "hyla")
    write_codes(root / "one_class.h5", run_task, FUZZY_ANALYSIS,
                {"term_present": lambda rng, n: np.tile([1, 0, 0, 1, 0, 0], (n, 1)),
                 "constant": lambda rng, n: np.zeros(n, dtype=np.int64)}, run_checkpoint, "hyla")
    data = fuzzy.read_bytes()
    (root / "truncated.h5").write_bytes(data[: len(data) // 2])
    (root / "not_hdf5.h5").write_text("latent codes, honestly\n")
    with h5py.File(root / "other.h5", "w") as file:
        file["x"] = np.arange(10)
    shutil.copy(fuzzy, root / "bad_attribute.h5")
    with h5py.File(root / "bad_attribute.h5", "r+") as file:
        file.attrs["task_config"] = "{not json"
    shutil.copy(fuzzy, root / "bad_label_attribute.h5")
    with h5py.File(root / "bad_label_attribute.h5", "r+") as file:
        file["labels/term_present"].attrs["column_names"] = "[x0, x1"
    shutil.copy(fuzzy, root / "existing.h5")
    (root / "existing.html").write_text("<html>my report</html>")

    config = json.loads((run / "config.json").read_text())["train"]
    (root / "config.json").write_text(json.dumps(config))
    (root / "config_not_json.json").write_text("preset: fuzzy_logic\n")
    (root / "config_list.json").write_text("[1, 2]")
    (root / "config_unknown.json").write_text(json.dumps({**config, "learning_rat": 0.1}))
    (root / "config_missing.json").write_text(json.dumps({"task": {"name": "fuzzy_logic"}}))
    (root / "a_file").write_text("a file, not a directory")
    (root / "a_dir").mkdir()
    (root / "a_dir" / "keep.txt").write_text("keep")
    (root / "empty_dir").mkdir()
    (root / "locked").mkdir()
    (root / "readonly").mkdir()
    add_hostile_inputs(root, fuzzy, run)
    add_issue_34_inputs(root, fuzzy, run_task, run_checkpoint)
    add_issue_45_inputs(root, run)
    add_issue_51_inputs(root)
    # A port another process listens on, for `view --serve --port` (its number in the file busy_port).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        (root / "busy_port").write_text(str(busy.getsockname()[1]))
        yield root


def copy_and_edit(source: Path, path: Path, edit) -> None:
    """A copy of the codes file `source` at `path`, changed by `edit(h5py.File)`."""
    shutil.copy(source, path)
    with h5py.File(path, "r+") as file:
        edit(file)


def replace_dataset(name: str, data) -> callable:
    def edit(file):
        del file[name]
        file[name] = data
    return edit


def add_hostile_inputs(root: Path, fuzzy: Path, run: Path) -> None:
    """Issue 23: what a second user sharing the directory could plant, and files and run
    directories whose structure is wrong where their syntax is right."""
    (root / "victim.txt").write_text("another user's file\n")
    (root / "link_existing.h5").symlink_to(root / "existing.h5")
    (root / "dangling.h5").symlink_to(root / "nowhere.h5")
    os.mkfifo(root / "fifo.h5")
    for suffix in (".csv", ".png", ".html"):
        (root / f"planted{suffix}").symlink_to(root / "victim.txt")
    (root / "mine_files").mkdir()
    (root / "mine_files" / "probes.csv").write_text("the user's own table")
    site = "codes/l0_q31_k31"
    copy_and_edit(fuzzy, root / "codes_1d.h5", replace_dataset(site, np.zeros(60)))
    copy_and_edit(fuzzy, root / "codes_strings.h5", replace_dataset(site, np.array([b"a"] * 60)))
    copy_and_edit(fuzzy, root / "codes_group.h5", lambda file: (file.__delitem__(site), file.create_group(site)))
    copy_and_edit(fuzzy, root / "split_group.h5", lambda file: (file.__delitem__("split"), file.create_group("split")))
    copy_and_edit(fuzzy, root / "rows_disagree.h5", replace_dataset("labels/task_index", np.zeros(50, dtype=np.int64)))
    copy_and_edit(fuzzy, root / "attribute_list.h5", lambda file: file.attrs.__setitem__("task_config", "[1, 2]"))
    copy_and_edit(fuzzy, root / "splits_object.h5", lambda file: file.attrs.__setitem__("splits", '{"train": 1}'))
    copy_and_edit(fuzzy, root / "provenance_not_json.h5",
                  replace_dataset("provenance", np.array(["{not json"], dtype=h5py.string_dtype())))
    config = json.loads((run / "config.json").read_text())
    (root / "config_seed.json").write_text(json.dumps({**config["train"], "seed": 2**32}))
    (root / "config_lr_text.json").write_text(json.dumps({**config["train"], "learning_rate": "fast"}))
    (root / "config_terabytes.json").write_text(json.dumps(
        {**config["train"], "model": {**config["train"]["model"], "d_model": 10**7, "d_mlp": 10**7}}))
    broken_runs = {
        "run_train_list": ({**config, "train": [1, 2]}, None, None),
        "run_model_missing": ({**config, "train": {k: v for k, v in config["train"].items() if k != "model"}}, None, None),
        "run_summary_list": (config, "[1, 2]", None),
        "run_summary_metrics_list": (config, json.dumps({"final_metrics": [1]}), None),
        "run_metrics_list": (config, None, '{"event": "train", "step": 1, "loss": 0.5}\n[1, 2]\n'),
        "run_eval_without_splits": (config, None, '{"event": "eval", "step": 5}\n'),
    }
    for name, (run_config, summary, metrics) in broken_runs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(run_config))
        if summary is not None:
            (root / name / "summary.json").write_text(summary)
        if metrics is not None:
            (root / name / "metrics.jsonl").write_text(metrics)


def tiny_png() -> bytes:
    """A valid 1 x 1 grey PNG, built from the format's definition."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b""))


def add_issue_34_inputs(root: Path, fuzzy: Path, run_task: dict, run_checkpoint: str) -> None:
    """Issue 34: damaged shards, damaged or foreign patch outputs (and a second user's link at a map),
    model directories whose own config is wrong, codes with NaN, a dangling soft link."""
    from latentcode.store import shard_path, write_sharded_file

    for name in ("sharded_replaced", "sharded_deleted"):
        shards = [shard_path(root / f"{name}.h5", rank, 2) for rank in range(2)]
        for shard in shards:
            write_codes(shard, run_task, FUZZY_ANALYSIS, FUZZY_LABELS, run_checkpoint, "hyla", n_per_split=10)
        write_sharded_file(root / f"{name}.h5", shards)
    # the same model's shard of another extraction, the same rows: it used to be read silently
    shard = shard_path(root / "sharded_replaced.h5", 1, 2)
    shard.unlink()
    write_codes(shard, run_task, FUZZY_ANALYSIS, FUZZY_LABELS, run_checkpoint, "hyla", n_per_split=10)
    with h5py.File(shard_path(root / "sharded_deleted.h5", 1, 2), "r+") as file:
        del file["codes/l1_q31_k31"]  # HDF5 used to read its 20 rows as zeros
    table = "group,n,follow (different),follow (third),transfer,transfer se\n0:31:*,16,0.5,0.25,0.25,0.1\n"
    summary = {"run": "run", "task": run_task, "split": "ood", "variant": "fixed_query", "n": 16, "groups": 1}
    patches = {
        "patch_not_json": (table, "{not json", None), "patch_list": (table, "[1, 2]", None),
        "patch_no_transfer": ("group,n\n0:31:*,16\n", json.dumps(summary), None),
        "patch_empty": ("", json.dumps(summary), None),
        "patch_text": ("group,transfer\n0:31:*,high\n", json.dumps(summary), None),
        "patch_sraven": (table, json.dumps({**summary, "task": {"name": "sraven", "n_features": 4}}), None),
        "patch_planted": (table, json.dumps(summary), "link"),
        "patch_good": (table, json.dumps(summary), tiny_png()),
    }
    for name, (csv, summary_text, image) in patches.items():
        (root / f"{name}.csv").write_text(csv)
        (root / f"{name}.json").write_text(summary_text)
        if image == "link":
            (root / f"{name}.png").symlink_to(root / "victim.txt")
        elif image is not None:
            (root / f"{name}.png").write_bytes(image)
    (root / "mine_files" / "patch_patch_good.png").symlink_to(root / "victim.txt")  # where the map's copy goes
    model = json.loads((root / "model_only" / "config.json").read_text())
    for name, config in {"model_text_dropout": {**model, "attn_dropout": "0.1"}, "model_config_list": [1, 2],
                         "model_terabytes": {**model, "d_model": 2**22, "d_mlp": 2**22, "kqv_dim": 2**22}}.items():
        shutil.copytree(root / "model_only", root / name)
        (root / name / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    metadata = {"model_name": "hyla", "model_config": {"attention": "hyla"}, "checkpoint_sha256": run_checkpoint,
                "task_config": run_task, "task_analysis": FUZZY_ANALYSIS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the writer warns of the NaN it stores
        with CodeWriter(root / "nan_codes.h5", SITES, 4, metadata) as writer:
            for split in ("train", "ood"):
                codes = {site: rng.normal(size=(30, 4)) for site in SITES}
                codes[SITES[1]][:3] = np.nan
                writer.append(codes=codes, labels={"task_index": rng.integers(0, 5, 30)}, split=split)
    with CodeWriter(root / "zero_rows.h5", SITES, 4, metadata):
        pass
    copy_and_edit(fuzzy, root / "soft_link.h5",
                  lambda file: file["labels"].__setitem__("ghost", h5py.SoftLink("/labels/nowhere")))


def add_issue_45_inputs(root: Path, run: Path) -> None:
    """Pretrained-model inputs refused before transformers (config.json and weights written by hand: the
    refusals come before any weight is read), damaged GGUF headers, runs asking for too much."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "vocab_size": 300}
    for name, edits, weights in [("hf_ok", {}, "model.safetensors"), ("hf_no_weights", {}, None),
                                 ("hf_heads_0", {"num_attention_heads": 0}, "model.safetensors"),
                                 ("hf_pickled", {}, "pytorch_model.bin"),
                                 ("hf_auto_map", {"auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}},
                                  "model.safetensors")]:
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps({**config, **edits}))
        if weights:
            (root / name / weights).write_bytes(b"weights")
    (root / "hf_tokenizer_auto_map").mkdir()
    (root / "hf_tokenizer_auto_map" / "config.json").write_text(json.dumps(config))
    (root / "hf_tokenizer_auto_map" / "model.safetensors").write_bytes(b"weights")
    (root / "hf_tokenizer_auto_map" / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}))
    import gguf

    writer = gguf.GGUFWriter(str(root / "whole.gguf"), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((64, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = (root / "whole.gguf").read_bytes()
    (root / "truncated.gguf").write_bytes(data[: len(data) // 2])
    (root / "absurd_counts.gguf").write_bytes(data[:8] + (2**60).to_bytes(8, "little") + data[16:])
    for name, edit in [("run_seq_len_huge", lambda c: c["train"]["task"].update(seq_len=10**9)),
                       ("run_model_list", lambda c: c.update(resolved_model_config=[1, 2])),
                       ("run_model_16_tib", lambda c: c["resolved_model_config"].update(d_model=2**21, n_layers=1024))]:
        shutil.copytree(run, root / name)
        record = json.loads((root / name / "config.json").read_text())
        edit(record)
        (root / name / "config.json").write_text(json.dumps(record))
    add_damaged_compact_stores(root)
    metadata = {"model_name": "hyla", "model_config": {"attention": "hyla"}, "checkpoint_sha256": "0" * 64,
                "task_config": json.loads((run / "config.json").read_text())["train"]["task"],
                "task_analysis": FUZZY_ANALYSIS}
    with CodeWriter(root / "zero_rows_with_splits.h5", SITES, 4, metadata) as writer:
        for split in ("train", "ood"):
            writer.append(codes={site: np.zeros((0, 4)) for site in SITES},
                          labels={"term_present": np.zeros((0, 6), dtype=np.int64),
                                  "task_index": np.zeros(0, dtype=np.int64)}, split=split)


# The damaged compact stores of issue 45 (workspace name, how test_store_compact's `_damage` breaks it)
COMPACT_DAMAGE = {"compact_nan_key": "nan key", "compact_nan_scale": "nan scale",
                  "compact_scale_minus_1000": "negative scale", "compact_keys_1e30": "keys of 1e30",
                  "compact_key_valid_all_false": "key_valid all false",
                  "compact_real_query_without_key": "one example without a real token"}


def add_damaged_compact_stores(root: Path) -> None:
    """A tiny random Llama (`hf_tiny`), a codes file of it with a compact store (`compact_ok.h5`) and a
    copy of it for each damage of COMPACT_DAMAGE, each used silently before issue 45."""
    import latentcode
    from tests.pretrained_models import save_tiny_llama
    from tests.test_store_compact import _damage

    save_tiny_llama(root / "hf_tiny")
    latentcode.extract(root / "hf_tiny", {"seq_len": 16}, "*:-1:-1", split="train", n=3, out=root / "compact_ok.h5",
                       batch_size=1, progress=False)
    for name, damage in COMPACT_DAMAGE.items():
        copy_and_edit(root / "compact_ok.h5", root / f"{name}.h5", lambda file, damage=damage: _damage(damage, file))


def add_issue_51_inputs(root: Path) -> None:
    """A language model's codes file as the token view reads it (token ids, their text, a compact store
    of one layer: 2 heads, 1 key/value head, 6 positions; numpy only), and one without the compact store."""
    rng = np.random.default_rng(0)
    site = Site(0, 5, 5)
    metadata = {"model_name": "toy-lm", "task_config": {}, "token_names": ["a", "b", "c", "<s>"]}
    compact = {"version": 1, "layers": [0], "n_heads": 2, "n_kv_heads": 1, "head_dim": 3, "seq_len": 6}
    for name, with_compact in (("tokens.h5", True), ("tokens_no_compact.h5", False)):
        with CodeWriter(root / name, [site], 2, {**metadata, **({"compact": compact} if with_compact else {})}) as writer:
            if with_compact:
                writer.write_compact("query_l0", rng.normal(size=(2, 2, 6, 3)).astype(np.float32),
                                     {"scale": "0.5", "causal": 1, "window": 0, "softcap": "0", "sinks": "[]"})
                writer.write_compact("key_l0", rng.normal(size=(2, 1, 6, 3)).astype(np.float32))
                writer.write_compact("key_valid", np.ones((2, 6), dtype=bool))
            writer.append(codes={site: rng.random((2, 2))}, extra={"token_ids": rng.integers(0, 4, (2, 6))},
                          split="validation")


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file and directory under root: kind, mode, size and content hash."""
    state = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        content = sha256(path) if path.is_file() else ""
        state[str(path.relative_to(root))] = (path.is_dir(), oct(info.st_mode), info.st_size if path.is_file() else 0,
                                             content)
    return state


@contextlib.contextmanager
def immutable(directory: Path):
    """The directory cannot be written in: immutable (as root, which permissions do not stop) or 0555."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(directory)]).returncode:
            pytest.skip("needs chattr +i (CAP_LINUX_IMMUTABLE) to make an unwritable directory as root")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
    else:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)


@contextlib.contextmanager
def read_only_file_system(directory: Path):
    """A read-only tmpfs mounted on the directory (needs root and CAP_SYS_ADMIN)."""
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(directory)],
                                           capture_output=True).returncode:
        pytest.skip("needs mount (root, CAP_SYS_ADMIN) for a read-only file system")
    try:
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


TRAIN = ["train", "--preset", "fuzzy_logic", "--scale", "tiny"]
SWEEP = ["sweep", "--preset", "fuzzy_logic", "--scale", "tiny"]
EXTRACT = ["extract", "{run}", "--n", "16"]
CUDA_MISSING = "--device 'cuda': this machine has no CUDA device (torch.cuda.is_available() is False); expected cpu"
# (id, command line with {placeholders} of workspace paths, what the one line must say, where it
# may need an immutable directory or a read-only file system)
BAD_INPUTS = [
    # train
    ("train-batch-size-0", [*TRAIN, "--batch-size", "0"], "argument --batch-size: expected a positive integer, got '0'"),
    ("train-batch-size-negative", [*TRAIN, "--batch-size", "-4"], "argument --batch-size: expected a positive integer"),
    ("train-lr-text", [*TRAIN, "--lr", "fast"], "argument --lr: expected a positive number, got 'fast'"),
    ("train-lr-zero", [*TRAIN, "--lr", "0"], "argument --lr: expected a positive number, got '0'"),
    ("train-lr-nan", [*TRAIN, "--lr", "nan"], "argument --lr: expected a positive number, got 'nan'"),
    ("train-n-layers-0", [*TRAIN, "--n-layers", "0"], "argument --n-layers: expected a positive integer"),
    ("train-mixed-precision", [*TRAIN, "--mixed-precision", "fp8"],
     "argument --mixed-precision: expected one of auto, no, bf16, fp16, got 'fp8'"),
    ("train-set-unknown-key", [*TRAIN, "--set", "nosuchkey=1"], "--set: unknown field 'nosuchkey'; valid fields: training ["),
    ("train-set-without-value", [*TRAIN, "--set", "frac_test"], "--set expects KEY=VALUE, got 'frac_test'"),
    ("train-unknown-preset", ["train", "--preset", "mnist"],
     f"unknown preset 'mnist'; valid presets: {', '.join(presets())}"),  # every task's, from the registry
    ("train-unknown-scale", [*TRAIN[:3], "--scale", "huge"], "--scale: unknown scale 'huge'; valid scales: tiny"),
    ("train-unknown-variant", [*TRAIN, "--variant", "mirrored"],
     "--variant: unknown variant 'mirrored' for task 'fuzzy_logic'; valid variants: ['uniform', 'fixed_context', "
     "'fixed_query']"),
    ("train-nothing-to-train", ["train"], "latentcode train needs --preset"),
    ("train-preset-and-config", [*TRAIN, "--config", "{config.json}"], "give either --preset or --config, not both"),
    ("train-config-directory", ["train", "--config", "{a_dir}"], "--config {a_dir} is a directory; expected a file"),
    ("train-config-missing", ["train", "--config", "{none.json}"], "--config {none.json} does not exist"),
    ("train-config-not-json", ["train", "--config", "{config_not_json.json}"],
     "--config {config_not_json.json} is not a JSON file (Expecting value: line 1 column 1"),
    ("train-config-not-an-object", ["train", "--config", "{config_list.json}"],
     "holds a JSON list; expected an object of TrainConfig fields"),
    ("train-config-unknown-field", ["train", "--config", "{config_unknown.json}"],
     "--config {config_unknown.json}: unknown TrainConfig field(s) ['learning_rat']"),
    ("train-config-missing-fields", ["train", "--config", "{config_missing.json}"],
     "--config {config_missing.json}: missing TrainConfig field(s) ['learning_rate', 'model'"),
    ("train-config-with-overrides", ["train", "--config", "{config.json}", "--lr", "0.1", "--set", "seq_len=8"],
     "--config takes every setting from its file; --lr, --set cannot be combined with it"),
    ("train-resume-not-a-run", ["train", "--resume", "{a_dir}"], "{a_dir} is not a latentcode run directory"),
    ("train-resume-with-preset", ["train", "--resume", "{run}", "--preset", "sraven"],
     "--resume continues a run with its own config; do not combine it with --preset"),
    ("train-resume-with-overrides", ["train", "--resume", "{run}", "--lr", "0.1", "--out", "{a_dir}"],
     "--resume continues a run with its own config and directory; --lr, --out cannot change them"),
    ("train-out-is-a-file", [*TRAIN, "--out", "{a_file}"], "--out {a_file} is a file; expected a directory"),
    ("train-out-under-a-file", [*TRAIN, "--out", "{a_file}/run"], "{a_file} is a file, not a directory"),
    ("train-out-immutable", [*TRAIN, "--out", "{locked}/run"], "cannot write in {locked} (no write permission"),
    ("train-out-read-only", [*TRAIN, "--out", "{readonly}/run"], "cannot write in {readonly} (read-only file system)"),
    # sweep
    ("sweep-seeds-not-numbers", [*SWEEP, "--out", "{a_dir}/s", "--seeds", "a,b"],
     "--seeds a,b: expected comma-separated non-negative integers"),
    ("sweep-grid-without-values", [*SWEEP, "--out", "{a_dir}/s", "--grid", "lr"], "--grid expects FIELD=V1,V2,..."),
    ("sweep-grid-unknown-field", [*SWEEP, "--out", "{a_dir}/s", "--grid", "lr=1,2"], "--grid lr=1,2: unknown field 'lr'"),
    ("sweep-grid-empty", [*SWEEP, "--out", "{a_dir}/s", "--grid", "learning_rate="], "no values after '='"),
    ("sweep-jobs-0", [*SWEEP, "--out", "{a_dir}/s", "--jobs", "0"], "argument --jobs: expected a positive integer"),
    ("sweep-unknown-preset", ["sweep", "--preset", "mnist", "--out", "{a_dir}/s"], "--preset mnist: unknown preset"),
    ("sweep-out-is-a-file", [*SWEEP, "--out", "{a_file}"], "--out {a_file} is a file; expected a directory"),
    # extract
    ("extract-run-missing", ["extract", "{none}", "--out", "{a_dir}/c.h5"],
     "RUN_DIR {none} is neither a finished run directory"),
    ("extract-run-empty-directory", ["extract", "{empty_dir}", "--out", "{a_dir}/c.h5"],
     "RUN_DIR {empty_dir} is neither a finished run directory"),
    ("extract-model-without-task", ["extract", "{model_only}", "--out", "{a_dir}/c.h5"],
     "is a model directory without its run: give its task, e.g. task="),
    ("extract-unknown-task", ["extract", "{model_only}", "--task", "name=mnist", "--out", "{a_dir}/c.h5"],
     "unknown task 'mnist'"),
    ("extract-task-without-value", ["extract", "{model_only}", "--task", "sraven", "--out", "{a_dir}/c.h5"],
     "--task expects KEY=VALUE, got 'sraven'"),
    ("extract-n-0", ["extract", "{run}", "--n", "0", "--out", "{a_dir}/c.h5"], "argument --n: expected a positive integer"),
    ("extract-dtype-float8", [*EXTRACT, "--dtype", "float8", "--out", "{a_dir}/c.h5"],
     "argument --dtype: invalid choice: 'float8' (choose from 'float32', 'bfloat16', 'float16')"),
    ("extract-device-not-a-device", [*EXTRACT, "--device", "gpu", "--out", "{a_dir}/c.h5"],
     "device 'gpu' is not a device name; expected cpu, cuda, cuda:N (N a GPU's number), mps or xpu"),
    ("extract-compact-of-a-latentcode-model", [*EXTRACT, "--compact", "--out", "{a_dir}/c.h5"],
     "compact=True (--compact): {run} is a latentcode model, whose codes are read at its hook points"),
    ("extract-batch-size-0", [*EXTRACT, "--batch-size", "0", "--out", "{a_dir}/c.h5"],
     "argument --batch-size: expected a positive integer, got '0'"),
    ("extract-seed-negative", [*EXTRACT, "--seed", "-1", "--out", "{a_dir}/c.h5"],
     "argument --seed: expected a non-negative integer below 4294967296, got '-1'"),
    ("extract-unknown-split", [*EXTRACT, "--split", "odd", "--out", "{a_dir}/c.h5"],
     "--split: unknown split 'odd' for task 'fuzzy_logic'; valid splits:"),
    ("extract-unknown-variant", [*EXTRACT, "--variant", "mirrored", "--out", "{a_dir}/c.h5"],
     "--variant: unknown variant 'mirrored' for task 'fuzzy_logic'"),
    ("extract-out-exists", [*EXTRACT, "--out", "{existing.h5}"],
     "--out {existing.h5} already exists; pass append=True (--append) to add examples to it, overwrite=True (--overwrite) to replace it"),
    ("extract-out-directory-overwrite", [*EXTRACT, "--out", "{a_dir}", "--overwrite"],
     "--out {a_dir} is a directory; expected the name of a file to write"),
    ("extract-out-under-a-file", [*EXTRACT, "--out", "{a_file}/c.h5"], "{a_file} is a file, not a directory"),
    ("extract-out-immutable", [*EXTRACT, "--out", "{locked}/c.h5"], "cannot write in {locked}"),
    ("extract-out-read-only", [*EXTRACT, "--out", "{readonly}/c.h5"], "(read-only file system)"),
    ("extract-append-truncated", [*EXTRACT, "--out", "{truncated.h5}", "--append"],
     "{truncated.h5} is a damaged or truncated HDF5 file"),
    ("extract-append-not-hdf5", [*EXTRACT, "--out", "{not_hdf5.h5}", "--append"], "{not_hdf5.h5} is not an HDF5 file"),
    ("extract-append-other-hdf5", [*EXTRACT, "--out", "{other.h5}", "--append"],
     "{other.h5} is an HDF5 file but not a latentcode codes file"),
    ("extract-append-and-overwrite", [*EXTRACT, "--out", "{existing.h5}", "--append", "--overwrite"],
     "append=True (--append) adds to the output and overwrite=True (--overwrite) replaces it: give one of them"),
    # probe
    ("probe-file-missing", ["probe", "{none.h5}", "--label", "x"], "codes file {none.h5} does not exist"),
    ("probe-directory", ["probe", "{a_dir}"], "codes file {a_dir} is a directory; expected a file"),
    ("probe-not-hdf5", ["probe", "{not_hdf5.h5}"], "{not_hdf5.h5} is not an HDF5 file"),
    ("probe-truncated", ["probe", "{truncated.h5}"], "{truncated.h5} is a damaged or truncated HDF5 file"),
    ("probe-other-hdf5", ["probe", "{other.h5}"], "is an HDF5 file but not a latentcode codes file"),
    ("probe-malformed-attribute", ["probe", "{bad_attribute.h5}"],
     "{bad_attribute.h5}: root attribute 'task_config' is not valid JSON"),
    ("probe-malformed-label-attribute", ["probe", "{bad_label_attribute.h5}"],
     "{bad_label_attribute.h5}: attribute 'column_names' of /labels/term_present is not valid JSON"),
    ("probe-unknown-label", ["probe", "{fuzzy.h5}", "--label", "nope"],
     "--label nope: {fuzzy.h5} has no label 'nope'; its labels are ['task_index', 'term_present']"),
    ("probe-unknown-fit-split", ["probe", "{fuzzy.h5}", "--fit-split", "test"],
     "--fit-split test: {fuzzy.h5} has no split 'test'; its splits are ['train', 'ood']"),
    ("probe-unknown-test-split", ["probe", "{fuzzy.h5}", "--test-split", "unseen_terms"],
     "--test-split unseen_terms: {fuzzy.h5} has no split 'unseen_terms'"),
    ("probe-cv-1", ["probe", "{fuzzy.h5}", "--cv", "1"], "argument --cv: expected an integer of at least 2, got '1'"),
    ("probe-one-class-multi-hot", ["probe", "{one_class.h5}", "--label", "term_present"],
     "--label term_present: every example of split 'train' in {one_class.h5} has the same value in each of its 6 "
     "columns"),
    ("probe-one-class-label", ["probe", "{one_class.h5}", "--label", "constant"],
     "every example of split 'train' in {one_class.h5} has the same value (0)"),
    ("probe-files-of-two-tasks", ["probe", "{fuzzy.h5}", "{sraven.h5}", "--label", "rule"],
     "codes file {fuzzy.h5} (hyla on task 'fuzzy_logic') and codes file {sraven.h5} (hyla on task 'sraven') come "
     "from different tasks"),
    ("probe-out-under-a-file", ["probe", "{fuzzy.h5}", "--out", "{a_file}/rule"], "{a_file} is a file, not a directory"),
    ("probe-out-read-only", ["probe", "{fuzzy.h5}", "--out", "{readonly}/rule"], "(read-only file system)"),
    ("probe-format", ["probe", "{fuzzy.h5}", "--format", "jpg"], "argument --format: invalid choice: 'jpg'"),
    # plot, heatmap, samples
    ("plot-file-missing", ["plot", "{none.h5}"], "codes file {none.h5} does not exist"),
    ("plot-truncated", ["plot", "{truncated.h5}"], "is a damaged or truncated HDF5 file"),
    ("plot-unknown-color", ["plot", "{fuzzy.h5}", "--color", "nope"], "--color nope: {fuzzy.h5} has no label 'nope'"),
    ("plot-unknown-split", ["plot", "{fuzzy.h5}", "--split", "test"], "--split test: {fuzzy.h5} has no split 'test'"),
    ("plot-max-points-0", ["plot", "{fuzzy.h5}", "--max-points", "0"], "argument --max-points: expected a positive"),
    ("plot-out-read-only", ["plot", "{fuzzy.h5}", "--out", "{readonly}/tsne"], "(read-only file system)"),
    ("heatmap-out-immutable", ["heatmap", "{sraven.h5}", "--out", "{locked}/similarity"], "cannot write in {locked}"),
    ("heatmap-unknown-label", ["heatmap", "{sraven.h5}", "--label", "query_rule"],
     "--label query_rule: {sraven.h5} has no label 'query_rule'; its labels are ['rule']"),
    ("heatmap-bad-attribute", ["heatmap", "{bad_attribute.h5}"], "root attribute 'task_config' is not valid JSON"),
    ("samples-unknown-layer", ["samples", "{sraven.h5}", "--layer", "7"],
     "--layer 7: {sraven.h5} has no layer 7; its layers are [0, 1]"),
    # report
    ("report-nothing", ["report"], "latentcode report needs RUN_DIR arguments, --codes files, or both"),
    ("report-run-missing", ["report", "{none}"], "RUN_DIR {none} does not exist"),
    ("report-not-a-run", ["report", "{a_dir}"], "{a_dir} is not a latentcode run directory (config.json is missing)"),
    ("report-run-with-codes-of-another-model", ["report", "{run}", "--codes", "{sraven.h5}", "--out", "{a_dir}/r.html"],
     "run {run} (hyla on task 'fuzzy_logic') and codes file {sraven.h5} (hyla on task 'sraven') come from "
     "different tasks"),
    ("report-run-with-codes-of-another-checkpoint", ["report", "{run}", "--codes", "{fuzzy_softmax.h5}"],
     "codes file {fuzzy_softmax.h5} (softmax on task 'fuzzy_logic') holds the codes of checkpoint "
     "{softmax_checkpoint}, which is not the model of any run given (run {run} (hyla on task 'fuzzy_logic'): "
     "checkpoint {run_checkpoint})"),
    ("report-run-with-codes-of-another-task", ["report", "{run}", "--codes", "{fuzzy_other_task.h5}"],
     "codes file {fuzzy_other_task.h5} (hyla on task 'fuzzy_logic') was extracted on another task than run {run} "
     "(hyla on task 'fuzzy_logic') was trained on (frac_test=0.5 in the codes, 0.7 in the run)"),
    ("report-codes-of-two-tasks", ["report", "--codes", "{fuzzy.h5}", "--codes", "{sraven.h5}"], "come from different tasks"),
    ("report-codes-truncated", ["report", "--codes", "{truncated.h5}"], "is a damaged or truncated HDF5 file"),
    ("report-codes-missing", ["report", "--codes", "{none.h5}"], "--codes {none.h5} does not exist"),
    ("report-unknown-label", ["report", "--codes", "{fuzzy.h5}", "--label", "rule"], "--label rule: {fuzzy.h5} has no label"),
    ("report-out-exists", ["report", "--codes", "{fuzzy.h5}", "--out", "{existing.html}"],
     "--out {existing.html} already exists; pass overwrite=True (--overwrite) to replace it"),
    ("report-out-directory-overwrite", ["report", "--codes", "{fuzzy.h5}", "--out", "{a_dir}", "--overwrite"],
     "--out {a_dir} is a directory; expected the name of a file"),
    ("report-out-under-a-file", ["report", "--codes", "{fuzzy.h5}", "--out", "{a_file}/r.html"], "is a file, not a directory"),
    ("report-out-immutable", ["report", "--codes", "{fuzzy.h5}", "--out", "{locked}/r.html"], "cannot write in {locked}"),
    ("report-max-points-0", ["report", "--codes", "{fuzzy.h5}", "--max-points", "0"], "argument --max-points"),
    # demo
    ("demo-unknown-task", ["demo", "--task", "mnist"], "--task mnist: unknown demo task; choose one of"),
    ("demo-models-missing", ["demo", "--models", "{none}"], "--models {none} is not a directory"),
    ("demo-models-without-checkpoints", ["demo", "--models", "{empty_dir}"],
     "--models {empty_dir} lacks the shipped checkpoints ['fuzzy_logic-softmax', 'fuzzy_logic-linear', "
     "'fuzzy_logic-hyla']"),
    ("demo-n-codes-0", ["demo", "--n-codes", "0"], "argument --n-codes: expected a positive integer"),
    ("demo-unknown-scale", ["demo", "--train", "--scale", "huge"], "--scale huge: unknown scale"),
    ("demo-out-under-a-file", ["demo", "--out", "{a_file}/demo"], "{a_file} is a file, not a directory"),
    ("demo-out-read-only", ["demo", "--out", "{readonly}/demo"], "(read-only file system)"),
    # issue 23: planted links, devices and FIFOs under output names are never written through or replaced
    ("extract-append-through-a-link", [*EXTRACT, "--out", "{link_existing.h5}", "--append"],
     "--out {link_existing.h5} is a symbolic link -> {existing.h5}; latentcode writes only regular files"),
    ("extract-overwrite-a-dangling-link", [*EXTRACT, "--out", "{dangling.h5}", "--overwrite"],
     "--out {dangling.h5} is a symbolic link -> {nowhere.h5}"),
    ("extract-new-file-at-a-dangling-link", [*EXTRACT, "--out", "{dangling.h5}"], "--out {dangling.h5} is a symbolic link"),
    ("extract-overwrite-a-fifo", [*EXTRACT, "--out", "{fifo.h5}", "--overwrite"], "--out {fifo.h5} is a FIFO"),
    ("probe-out-planted-link", ["probe", "{fuzzy.h5}", "--out", "{planted}", "--overwrite"],
     "--out {planted.csv} is a symbolic link -> {victim.txt}"),
    ("plot-out-planted-link", ["plot", "{fuzzy.h5}", "--out", "{planted}", "--overwrite"],
     "--out {planted.png} is a symbolic link"),
    ("heatmap-out-planted-link", ["heatmap", "{sraven.h5}", "--out", "{planted}", "--overwrite"],
     "--out {planted.png} is a symbolic link"),
    ("intervene-out-planted-link", ["intervene", "{run}", "--zero-ablate", "all", "--out", "{planted}", "--overwrite"],
     "--out {planted.csv} is a symbolic link"),
    ("report-out-planted-link", ["report", "--codes", "{fuzzy.h5}", "--out", "{planted.html}", "--overwrite"],
     "--out {planted.html} is a symbolic link"),
    ("report-files-of-the-user", ["report", "--codes", "{fuzzy.h5}", "--out", "{mine.html}"],
     "--out {mine.html}: {mine_files} already holds files; pass overwrite=True (--overwrite)"),
    ("extract-out-name-too-long", [*EXTRACT, "--out", "{a_dir}/" + "x" * 300 + ".h5"],
     "--out {a_dir}/" + "x" * 300 + ".h5: File name too long"),
    ("probe-out-name-too-long", ["probe", "{fuzzy.h5}", "--out", "{a_dir}/" + "x" * 300],
     "--out {a_dir}/" + "x" * 300 + ": File name too long"),
    # issue 23: codes files whose structure is wrong
    ("probe-codes-1d", ["probe", "{codes_1d.h5}"],
     "{codes_1d.h5}: /codes/l0_q31_k31 is a 1-D float64 dataset; expected a 2-D float dataset [examples, heads]"),
    ("probe-codes-strings", ["probe", "{codes_strings.h5}"], "/codes/l0_q31_k31 is a 1-D |S1 dataset; expected a 2-D"),
    ("probe-codes-group", ["probe", "{codes_group.h5}"], "{codes_group.h5}: /codes/l0_q31_k31 is a group; expected a 2-D"),
    ("probe-split-group", ["probe", "{split_group.h5}"], "{split_group.h5}: /split is a group; expected a dataset"),
    ("probe-row-counts-disagree", ["probe", "{rows_disagree.h5}"],
     "{rows_disagree.h5}: /labels/task_index has 50 rows but /split has 60"),
    ("plot-attribute-of-the-wrong-type", ["plot", "{attribute_list.h5}"],
     "{attribute_list.h5}: root attribute 'task_config' holds a JSON list; expected a JSON object"),
    ("heatmap-splits-attribute-an-object", ["heatmap", "{splits_object.h5}"],
     "root attribute 'splits' holds a JSON dict; expected a JSON list"),
    ("report-provenance-not-json", ["report", "--codes", "{provenance_not_json.h5}"],
     "{provenance_not_json.h5}: /provenance entry 0 is not a JSON object"),
    # issue 23: run directories whose JSON has the wrong types
    ("report-run-train-a-list", ["report", "{run_train_list}"], "is not a well-formed run config: 'train' is a JSON list"),
    ("report-run-model-missing", ["report", "{run_model_missing}"], "'train.model' is missing; expected an object"),
    ("report-run-summary-a-list", ["report", "{run_summary_list}"],
     "{run_summary_list}/summary.json is a JSON list; expected an object with final_metrics"),
    ("report-run-final-metrics-a-list", ["report", "{run_summary_metrics_list}"],
     "final_metrics is not an object of metrics per split"),
    ("report-run-metrics-line-a-list", ["report", "{run_metrics_list}"],
     "{run_metrics_list}/metrics.jsonl line 2 holds a JSON list; expected an object"),
    ("report-run-eval-without-splits", ["report", "{run_eval_without_splits}"],
     "metrics.jsonl line 1 is an eval record without a numeric step and an object of metrics per split"),
    # issue 23: numbers out of range are refused before any work
    ("extract-wait-for-lock-nan", [*EXTRACT, "--out", "{a_dir}/c.h5", "--wait-for-lock", "nan"],
     "argument --wait-for-lock: expected a non-negative number, got 'nan'"),
    ("extract-wait-for-lock-inf", [*EXTRACT, "--out", "{a_dir}/c.h5", "--wait-for-lock", "inf"],
     "argument --wait-for-lock: expected a non-negative number, got 'inf'"),
    ("extract-wait-for-lock-negative", [*EXTRACT, "--out", "{a_dir}/c.h5", "--wait-for-lock", "-1"],
     "argument --wait-for-lock: expected a non-negative number, got '-1'"),
    ("extract-seed-2-32", [*EXTRACT, "--seed", "4294967296", "--out", "{a_dir}/c.h5"],
     "argument --seed: expected a non-negative integer below 4294967296, got '4294967296'"),
    ("train-seed-2-32", [*TRAIN, "--seed", "4294967296"],
     "argument --seed: expected a non-negative integer below 4294967296, got '4294967296'"),
    ("train-config-seed-2-32", ["train", "--config", "{config_seed.json}"],
     "seed must be a non-negative integer below 2**32 (numpy and torch seeds are 32-bit), got 4294967296"),
    ("train-config-text-learning-rate", ["train", "--config", "{config_lr_text.json}"],
     "learning_rate must be a finite number, got 'fast'"),
    # d_model = d_mlp = 10^7: the two MLP matrices alone are 2 x 10^14 parameters a layer, 745 TiB in float32
    ("train-config-terabytes", ["train", "--config", "{config_terabytes.json}"],
     "TiB to train (weights, gradients and two AdamW moments in float32); this machine has"),
    ("count-features-100000", ["tasks", "count", "--features", "100000"],
     "argument --features: expected an integer of at least 2 below 10001, got '100000'"),
    # log10(10 x (100000!)^2 x 100000) = 1 + 2 x 456,573.45 + 5 (log10(100000!) by Stirling's formula)
    ("ambiguity-features-100000", ["tasks", "ambiguity", "--features", "100000", "--n", "10"],
     "= about 10^913,153 checks, more than the limit of 1,000,000,000"),
    ("sweep-seeds-2-32", [*SWEEP, "--out", "{a_dir}/s", "--seeds", "0,4294967296"],
     "--seeds 0,4294967296: expected comma-separated non-negative integers below 4294967296"),
    ("probe-seed-2-32", ["probe", "{fuzzy.h5}", "--seed", "4294967296"], "argument --seed: expected a non-negative integer below"),
    ("intervene-seed-2-32", ["intervene", "{run}", "--zero-ablate", "all", "--seed", "4294967296", "--out", "{a_dir}/e"],
     "argument --seed: expected a non-negative integer below 4294967296"),
    ("intervene-scale-nan", ["intervene", "{run}", "--scale", "nan", "--out", "{a_dir}/e"],
     "argument --scale: expected a finite number, got 'nan'"),
    ("intervene-scale-inf", ["intervene", "{run}", "--scale=-inf", "--out", "{a_dir}/e"],
     "argument --scale: expected a finite number, got '-inf'"),
    ("intervene-add-inf", ["intervene", "{run}", "--add", "inf,0,0,0", "--out", "{a_dir}/e"],
     "--add expects finite numbers, one per head (e.g. 0.5,0,1.2); got 'inf,0,0,0'"),
    ("intervene-set-nan", ["intervene", "{run}", "--set", "0,nan,0,0", "--out", "{a_dir}/e"], "--set expects finite numbers"),
    # sizes whose memory or disk need exceeds the machine: refused with the estimate before any work (they gave
    # numpy's "Unable to allocate 7.28 TiB" traceback, or ran until the disk was full)
    ("extract-batch-needs-terabytes", [*EXTRACT[:2], "--n", "10000000000", "--batch-size", "10000000000", "--out",
                                       "{a_dir}/c.h5"], "TiB of memory; this machine has"),
    ("extract-codes-need-terabytes-on-disk", [*EXTRACT[:2], "--n", "1000000000000", "--sites", "*:*:*", "--out",
                                              "{a_dir}/c.h5"], "x 2048 sites x 8 heads of float32 codes need"),
    ("intervene-n-needs-terabytes", ["intervene", "{run}", "--zero-ablate", "all", "--n", "100000000000", "--out",
                                     "{a_dir}/e"], "--n 100000000000 instances (sequences of 32)"),
    ("intervene-batch-needs-terabytes", ["intervene", "{run}", "--zero-ablate", "all", "--n", "10000000000",
                                         "--batch-size", "10000000000", "--out", "{a_dir}/e"], "TiB of memory"),
    # patch (more in tests/intervention/test_patch_cli.py)
    # 10^9 x 4 sequences of 32 tokens x 5 features x 4 bytes = 2.3 TiB of inputs alone
    ("patch-n-10-9", ["patch", "{run}", "--n", "1000000000", "--out", "{a_dir}/p"],
     "--n 1000000000 base/donor pairs (sequences of 32, with 3 donors each) needs at least 2.4 TiB of memory"),
    ("patch-unknown-split", ["patch", "{run}", "--split", "odd", "--out", "{a_dir}/p"],
     "--split: unknown split 'odd' for task 'fuzzy_logic'; valid splits: ['train', 'test', 'ood', 'unseen_terms']"),
    ("patch-unknown-variant", ["patch", "{run}", "--variant", "mirrored", "--out", "{a_dir}/p"],
     "--variant: unknown variant 'mirrored' for task 'fuzzy_logic'"),
    ("patch-seed-2-32", ["patch", "{run}", "--seed", "4294967296", "--out", "{a_dir}/p"],
     "argument --seed: expected a non-negative integer below 4294967296, got '4294967296'"),
    # issue 33: every check of plan_patch (the run has 2 layers and 32 tokens; one prediction)
    ("patch-model-directory-without-its-run", ["patch", "{model_only}", "--out", "{a_dir}/p"],
     "RUN_DIR {model_only} is not a finished run directory (config.json and model/model.safetensors); patch reads "
     "the task of the run to draw its pairs"),
    ("patch-grid-and-group", ["patch", "{run}", "--grid", "rows", "--group", "1:*:*", "--out", "{a_dir}/p"],
     "error: give one of --search, --grid or --group"),
    ("patch-search-with-attribution", ["patch", "{run}", "--search", "--attribution", "--out", "{a_dir}/p"],
     "error: --attribution goes with --grid or --group; --search ranks its candidates by attribution itself"),
    ("patch-layer-outside", ["patch", "{run}", "--layers", "7", "--out", "{a_dir}/p"],
     "--layers '7': the model has 2 layers (0..1); got [7]"),
    ("patch-layers-not-integers", ["patch", "{run}", "--layers", "x", "--out", "{a_dir}/p"],
     "--layers expects layer indices such as 0,2; got 'x'"),
    ("patch-search-layer-outside", ["patch", "{run}", "--search", "--layers", "-3", "--out", "{a_dir}/p"],
     "--layers '-3': the model has 2 layers (0..1); got [-3]"),
    ("patch-unknown-partition", ["patch", "{run}", "--grid", "slot", "--out", "{a_dir}/p"],
     "--grid 'slot': expected a partition name or QUERY/KEY of two, among block, context, example"),
    ("patch-queries-past-the-sequence", ["patch", "{run}", "--queries", "30..40", "--out", "{a_dir}/p"],
     "--queries '30..40': range 30..40 reaches past the sequence of 32 tokens"),
    ("patch-queries-unreadable", ["patch", "{run}", "--queries", "a..b", "--out", "{a_dir}/p"], "--queries"),
    ("patch-more-key-blocks-than-keys", ["patch", "{run}", "--key-blocks", "99", "--out", "{a_dir}/p"],
     "--key-blocks: the sequence has 32 keys, so at most 32 key blocks; got 99"),
    ("patch-too-many-groups", ["patch", "{run}", "--key-blocks", "9", "--out", "{a_dir}/p"],
     "--grid rows makes 576 groups, more than --max-groups 256 (each costs 3 x --n 256 forward passes); give "
     "--max-groups 576 to run them all"),
    ("patch-prediction-outside", ["patch", "{run}", "--prediction", "5", "--out", "{a_dir}/p"],
     "--prediction 5: the task has 1 prediction positions (0..0, or negative from the end)"),
    ("patch-heads-site-outside", ["patch", "{run}", "--grid", "heads", "--sites", "9:0:0", "--out", "{a_dir}/p"],
     "--sites: site 9:0:0: layer 9 is outside the model's 2 layers (0..1)"),
    ("patch-group-unreadable", ["patch", "{run}", "--group", "1:x:1", "--out", "{a_dir}/p"],
     "--group: cannot read site '1:x:1'"),
    ("patch-outputs-there-already", ["patch", "{run}", "--out", "{patch_good}"],
     "--out {patch_good}: {patch_good.csv}, {patch_good.json}, {patch_good.png} already exist; pass overwrite=True "
     "(--overwrite) to replace them"),
    # /proc passes the permission test as root, yet nothing can be created there: refused by the check
    ("patch-out-in-proc", ["patch", "{run}", "--out", "/proc/x/p"],
     "--out /proc/x/p: cannot write in /proc (creating anything there fails: "),
    ("report-out-in-proc", ["report", "--codes", "{fuzzy.h5}", "--out", "/proc/r.html"],
     "--out /proc/r.html: cannot write in /proc (creating anything there fails: "),
    ("patch-map-a-planted-link", ["patch", "{run}", "--overwrite", "--out", "{patch_planted}"],
     "--out {patch_planted.png} is a symbolic link -> {victim.txt}; latentcode writes only regular files"),
    # issue 34: damaged shards are refused, never read as another extraction's rows or as zeros
    ("probe-shard-of-another-extraction", ["probe", "{sharded_replaced.h5}"],
     "{sharded_replaced.h5}: its shard {sharded_replaced.shard-1-of-2.h5} has file_id"),
    ("probe-shard-lacks-a-dataset", ["probe", "{sharded_deleted.h5}"],
     "{sharded_deleted.h5}: its shard {sharded_deleted.shard-1-of-2.h5} lacks the dataset /codes/l1_q31_k31"),
    ("heatmap-shard-lacks-a-dataset", ["heatmap", "{sharded_deleted.h5}", "--label", "task_index"],
     "lacks the dataset /codes/l1_q31_k31 (HDF5 would read its rows as zeros)"),
    # issue 34: damaged or foreign patch outputs, and a second user's link at a map
    ("report-patch-not-json", ["report", "--codes", "{fuzzy.h5}", "--patch", "{patch_not_json}"],
     "--patch {patch_not_json.json} is not a JSON file"),
    ("report-patch-a-list", ["report", "--codes", "{fuzzy.h5}", "--patch", "{patch_list}"],
     "--patch {patch_list.json} holds a JSON list; expected an object"),
    ("report-patch-no-transfer-column", ["report", "--codes", "{fuzzy.h5}", "--patch", "{patch_no_transfer}"],
     "--patch {patch_no_transfer.csv} lacks the column(s) ['transfer']"),
    ("report-patch-empty-csv", ["report", "--codes", "{fuzzy.h5}", "--patch", "{patch_empty}"],
     "--patch {patch_empty.csv} is empty"),
    ("report-patch-text-for-numbers", ["report", "--codes", "{fuzzy.h5}", "--patch", "{patch_text}"],
     "--patch {patch_text.csv} line 2: column 'transfer' holds 'high'; expected a number"),
    ("report-patch-of-another-task", ["report", "--codes", "{fuzzy.h5}", "--patch", "{patch_sraven}"],
     "--patch {patch_sraven.json} (task 'sraven') comes from another task than codes file {fuzzy.h5}"),
    ("report-patch-map-a-planted-link", ["report", "--codes", "{fuzzy.h5}", "--patch", "{patch_planted}"],
     "--patch {patch_planted.png} is a symbolic link -> {victim.txt}; latentcode reads only regular files"),
    ("report-patch-copy-onto-a-planted-link", ["report", "--codes", "{fuzzy.h5}", "--patch", "{patch_good}", "--out",
                                               "{mine.html}", "--overwrite"], "is a symbolic link"),
    # issue 34: a model directory's own config is checked as a run's is
    ("extract-model-config-text-dropout", ["extract", "{model_text_dropout}", "--task", "name=fuzzy_logic", "--out",
                                           "{a_dir}/c.h5"], "its config.json is not a config a model can be built "
     "from: attn_dropout must be in [0, 1), got '0.1'"),
    ("extract-model-config-a-list", ["extract", "{model_config_list}", "--task", "name=fuzzy_logic", "--out",
                                     "{a_dir}/c.h5"], "holds a JSON list; expected an object of ModelConfig fields"),
    ("intervene-model-of-terabytes", ["intervene", "{model_terabytes}", "--task", "name=fuzzy_logic", "--zero-ablate",
                                      "all", "--out", "{a_dir}/e"], "the model its config describes needs at least"),
    # issue 34: files a command could not read in one line
    ("probe-zero-rows", ["probe", "{zero_rows.h5}"], "{zero_rows.h5} holds no examples (0 rows)"),
    ("samples-zero-rows", ["samples", "{zero_rows.h5}", "--label", "task_index"],
     "{zero_rows.h5} holds no examples (0 rows)"),
    # issue 45: zero rows with splits and labels (cannot reshape, ZeroDivisionError before)
    ("probe-zero-rows-with-splits", ["probe", "{zero_rows_with_splits.h5}"],
     "{zero_rows_with_splits.h5} holds no examples (0 rows)"),
    ("report-zero-rows-with-splits", ["report", "--codes", "{zero_rows_with_splits.h5}", "--out", "{a_dir}/r.html"],
     "{zero_rows_with_splits.h5} holds no examples (0 rows)"),
    ("samples-zero-rows-with-splits", ["samples", "{zero_rows_with_splits.h5}", "--out", "{a_dir}/s"],
     "{zero_rows_with_splits.h5} holds no examples (0 rows)"),
    # issue 45: pretrained models refused before transformers (a traceback, or a silent cut, before)
    ("extract-pretrained-seq-len-text", ["extract", "{hf_ok}", "--task", "seq_len=long", "--out", "{a_dir}/c.h5"],
     "--task: seq_len='long' must be an integer"),
    ("extract-pretrained-seq-len-fraction", ["extract", "{hf_ok}", "--task", "seq_len=64.5", "--out", "{a_dir}/c.h5"],
     "seq_len=64.5 must be an integer"),
    ("extract-pretrained-no-weights", ["extract", "{hf_no_weights}", "--out", "{a_dir}/c.h5"],
     "{hf_no_weights} holds no weights (no *.safetensors file)"),
    ("extract-pretrained-heads-0", ["extract", "{hf_heads_0}", "--out", "{a_dir}/c.h5"],
     "config.json has num_attention_heads 0; expected a positive integer"),
    ("extract-pretrained-pickled-weights", ["extract", "{hf_pickled}", "--out", "{a_dir}/c.h5"],
     "holds its weights as pytorch_model.bin, a pickle, which latentcode does not load"),
    ("extract-pretrained-auto-map", ["extract", "{hf_auto_map}", "--out", "{a_dir}/c.h5"],
     "config.json has an auto_map (AutoConfig: configuration_evil.EvilConfig)"),
    ("extract-pretrained-tokenizer-auto-map", ["extract", "{hf_tokenizer_auto_map}", "--out", "{a_dir}/c.h5"],
     "tokenizer_config.json has an auto_map (AutoTokenizer: ['tokenization_evil.EvilTokenizer', None])"),
    ("extract-smollm2-seq-len-text", ["extract", "smollm2", "--task", "seq_len=long", "--out", "{a_dir}/c.h5"],
     "--task: seq_len='long' must be an integer"),
    ("extract-smollm2-seq-len-fraction", ["extract", "smollm2", "--task", "seq_len=64.5", "--out", "{a_dir}/c.h5"],
     "--task seq_len=64.5 must be an integer"),
    ("extract-gguf-truncated", ["extract", "{truncated.gguf}", "--out", "{a_dir}/c.h5"],
     "{truncated.gguf} is truncated or damaged: tensor token_embd.weight ends at byte"),
    ("extract-gguf-absurd-counts", ["extract", "{absurd_counts.gguf}", "--out", "{a_dir}/c.h5"],
     "{absurd_counts.gguf} declares 1152921504606846976 tensors, more than its"),
    ("patch-pretrained-beyond-its-budget", ["patch", "smollm2", "--layers", "0", "--n", "1000000", "--task",
                                            "seq_len=128", "--out", "{a_dir}/p"],
     "--n: n=1000000 windows x (9 groups + 2) passes x 128 tokens is 1,408,000,000 tokens through the model, beyond"),
    # issue 45: runs asking for too much, refused as training refuses them
    ("extract-run-seq-len-huge", ["extract", "{run_seq_len_huge}", "--out", "{a_dir}/c.h5"],
     "seq_len=1000000000 for task 'fuzzy_logic' is beyond 1,048,576 tokens"),
    ("extract-run-model-config-list", ["extract", "{run_model_list}", "--out", "{a_dir}/c.h5"],
     "'resolved_model_config' is a JSON list; expected an object"),
    ("extract-run-model-16-tib", ["extract", "{run_model_16_tib}", "--out", "{a_dir}/c.h5"],
     "the model its config describes needs at least"),
    # issue 45: a damaged compact store is refused at open, naming the dataset (its rows were zeros, or
    # plausible rows summing to 1, and intervene --mean-ablate reported losses from it)
    ("probe-compact-nan-key", ["probe", "{compact_nan_key.h5}"],
     "{compact_nan_key.h5}: /compact/key_l1 holds a NaN or infinite key (example 1)"),
    ("probe-compact-nan-scale", ["probe", "{compact_nan_scale.h5}"],
     "{compact_nan_scale.h5}: /compact/query_l1 has scale nan; expected a positive finite number"),
    ("probe-compact-scale-minus-1000", ["probe", "{compact_scale_minus_1000.h5}"],
     "{compact_scale_minus_1000.h5}: /compact/query_l1 has scale -1000.0; expected a positive finite number"),
    ("probe-compact-keys-1e30", ["probe", "{compact_keys_1e30.h5}"],
     "{compact_keys_1e30.h5}: /compact/key_l0 and /compact/query_l0 hold keys up to norm 2.83e+30"),
    ("probe-compact-key-valid-all-false", ["probe", "{compact_key_valid_all_false.h5}"],
     "{compact_key_valid_all_false.h5}: /compact/key_valid marks no key of example 0 as real"),
    ("probe-compact-real-query-without-key", ["probe", "{compact_real_query_without_key.h5}"],
     "{compact_real_query_without_key.h5}: /compact/key_valid marks no key of example 2 as real"),
    *[(f"intervene-mean-ablate-{name.replace('_', '-')}",
       ["intervene", "{hf_tiny}", "--sites", "1:*:*", "--mean-ablate", "all", "--codes", f"{{{name}.h5}}", "--task",
        "seq_len=16", "--n", "2", "--out", "{a_dir}/e"], f"{{{name}.h5}}: /compact/")
      for name in COMPACT_DAMAGE],
    ("probe-dangling-soft-link", ["probe", "{soft_link.h5}"],
     "{soft_link.h5}: /labels/ghost is a soft link to /labels/nowhere, which is not in the file"),
    # issue 34: silently accepted before
    ("extract-sraven-rule-on-permuted", ["extract", str(MODELS / "sraven-hyla"), "--sites", "sraven-rule", "--variant",
                                         "permuted", "--out", "{a_dir}/c.h5"],
     "--variant permuted: the sites 'sraven-rule' are defined on 'unpermuted' instances of task 'sraven'"),
    ("sweep-grid-unknown-attention", [*SWEEP, "--out", "{a_dir}/s", "--grid", "attention=magic"],
     "--grid attention=magic: unknown attention 'magic'; expected presets among softmax"),
    ("plot-color-of-several-columns", ["plot", "{fuzzy.h5}", "--color", "term_present", "--out", "{a_dir}/p"],
     "--color term_present: label 'term_present' has shape [N, 6]: colour by one column"),
    ("probe-newline-in-an-argument", ["probe", "{none}\nsecond.h5"], "codes file {none}\\nsecond.h5 does not exist"),
    # reuse
    ("reuse-not-a-run", ["reuse", "{a_dir}", "--out", "{a_dir}/r"], "RUN_DIR {a_dir} is not a run directory"),
    ("reuse-model-only", ["reuse", "{model_only}", "--out", "{a_dir}/r"], "RUN_DIR {model_only} is not a run directory"),
    ("reuse-sraven", ["reuse", str(MODELS / "sraven-hyla"), "--out", "{a_dir}/r"],
     "needs a task whose compositions are sets of constituents (fuzzy_logic); got 'sraven'"),
    ("reuse-n-pairs-0", ["reuse", "{run}", "--n-pairs", "0", "--out", "{a_dir}/r"],
     "argument --n-pairs: expected a positive integer, got '0'"),
    ("reuse-out-under-a-file", ["reuse", "{run}", "--out", "{a_file}/r"], "is a file, not a directory"),
    # qk (issue 48)
    ("qk-layer-out-of-range", ["qk", str(MODELS / "sraven-hyla"), "--layer", "4", "--head", "0", "--pairs", "previous",
                               "--out", "{a_dir}/q"], "--layer 4 is outside the model's 4 layers; expected 0..3"),
    ("qk-head-out-of-range", ["qk", str(MODELS / "sraven-hyla"), "--layer", "2", "--head", "16", "--pairs", "previous",
                              "--out", "{a_dir}/q"], "--head 16 is outside the model's 16 heads; expected 0..15"),
    ("qk-unknown-pairs", ["qk", str(MODELS / "sraven-hyla"), "--layer", "2", "--head", "0", "--pairs", "successor",
                          "--out", "{a_dir}/q"], "--pairs: unknown pair selector 'successor'"),
    # qk of a codes file: its example, layer and head checked in its compact store before torch loads
    ("qk-codes-example-out-of-range", ["qk", "{tokens.h5}", "--example", "5", "--layer", "0", "--head", "0",
                                       "--pairs", "previous", "--out", "{a_dir}/q"],
     "--example 5 is outside the 2 examples of {tokens.h5}; expected 0..1"),
    ("qk-codes-layer-not-stored", ["qk", "{tokens.h5}", "--layer", "3", "--head", "0", "--pairs", "previous",
                                   "--out", "{a_dir}/q"], "--layer 3: {tokens.h5} stores queries and keys of layers [0]"),
    ("qk-codes-head-out-of-range", ["qk", "{tokens.h5}", "--layer", "0", "--head", "2", "--pairs", "previous",
                                    "--out", "{a_dir}/q"], "--head 2 is outside the 2 heads of {tokens.h5}; expected 0..1"),
    ("qk-codes-no-compact-store", ["qk", "{tokens_no_compact.h5}", "--layer", "0", "--head", "0", "--pairs",
                                   "previous", "--out", "{a_dir}/q"], "{tokens_no_compact.h5} has no compact store"),
    # issue 47: --device and --dtype of every command that runs a model, one check (validation.check_placement);
    # CUDA rows need torch to know (skipped where CUDA is; not in the torch-free test); an output already
    # there (--overwrite) is kept by a refused command
    ("intervene-dtype-float8", ["intervene", "{run}", "--zero-ablate", "all", "--dtype", "float8", "--out", "{a_dir}/e"],
     "argument --dtype: invalid choice: 'float8' (choose from 'float32', 'bfloat16', 'float16')"),
    ("intervene-device-tpu", ["intervene", "{run}", "--zero-ablate", "all", "--device", "tpu", "--out", "{a_dir}/e"],
     "--device 'tpu' is not a device name; expected cpu, cuda, cuda:N (N a GPU's number), mps or xpu"),
    ("patch-dtype-float8", ["patch", "{run}", "--dtype", "float8", "--out", "{a_dir}/p"],
     "argument --dtype: invalid choice: 'float8' (choose from 'float32', 'bfloat16', 'float16')"),
    ("patch-device-tpu", ["patch", "{run}", "--device", "tpu", "--out", "{a_dir}/p"],
     "--device 'tpu' is not a device name; expected cpu, cuda, cuda:N (N a GPU's number), mps or xpu"),
    ("patch-search-device-tpu", ["patch", "{run}", "--search", "--device", "tpu", "--out", "{a_dir}/p"],
     "--device 'tpu' is not a device name; expected cpu, cuda, cuda:N (N a GPU's number), mps or xpu"),
    ("qk-dtype-float8", ["qk", str(MODELS / "sraven-hyla"), "--layer", "2", "--head", "0", "--pairs", "previous",
                         "--dtype", "float8", "--out", "{a_dir}/q"],
     "argument --dtype: invalid choice: 'float8' (choose from 'float32', 'bfloat16', 'float16')"),
    ("qk-device-tpu", ["qk", str(MODELS / "sraven-hyla"), "--layer", "2", "--head", "0", "--pairs", "previous",
                       "--device", "tpu", "--out", "{a_dir}/q"],
     "--device 'tpu' is not a device name; expected cpu, cuda, cuda:N (N a GPU's number), mps or xpu"),
    ("train-dtype-float8", [*TRAIN, "--dtype", "float8", "--out", "{a_dir}/r"],
     "argument --dtype: invalid choice: 'float8' (choose from 'float32', 'bfloat16', 'float16')"),
    ("train-device-tpu", [*TRAIN, "--device", "tpu", "--out", "{a_dir}/r"],
     "--device 'tpu' is not a device name; expected cpu, cuda, cuda:N (N a GPU's number), mps or xpu"),
    ("train-dtype-against-mixed-precision", [*TRAIN, "--mixed-precision", "no", "--dtype", "bfloat16", "--out",
                                             "{a_dir}/r"],
     "--dtype 'bfloat16' computes with mixed_precision 'bf16', but the config sets mixed_precision 'no'; give one"),
    ("train-resume-with-dtype", ["train", "--resume", "{run}", "--dtype", "bfloat16"],
     "--dtype 'bfloat16': resume continues a run in the precision of its own config"),
    ("extract-device-cuda", [*EXTRACT, "--device", "cuda", "--out", "{existing.h5}", "--overwrite"], CUDA_MISSING),
    ("intervene-device-cuda", ["intervene", "{run}", "--zero-ablate", "all", "--device", "cuda", "--out",
                               "{patch_good}", "--overwrite"], CUDA_MISSING),
    ("patch-device-cuda", ["patch", "{run}", "--device", "cuda", "--out", "{patch_good}", "--overwrite"], CUDA_MISSING),
    ("qk-device-cuda", ["qk", str(MODELS / "sraven-hyla"), "--layer", "2", "--head", "0", "--pairs", "previous",
                        "--device", "cuda", "--out", "{a_dir}", "--overwrite"], CUDA_MISSING),
    ("train-device-cuda", [*TRAIN, "--device", "cuda", "--out", "{a_dir}/r"], CUDA_MISSING),
    # view
    ("view-no-file", ["view", "{none}"], "codes file {none} does not exist"),
    ("view-unknown-split", ["view", "{fuzzy.h5}", "--split", "nope", "--out", "{a_dir}/v.html"],
     "--split nope: {fuzzy.h5} has no split 'nope'; its splits are"),
    ("view-unknown-color", ["view", "{fuzzy.h5}", "--color", "nope", "--out", "{a_dir}/v.html"],
     "--color nope: {fuzzy.h5} has no label 'nope'; its labels are"),
    ("view-probes-not-csv", ["view", "{fuzzy.h5}", "--probes", "{a_file}", "--out", "{a_dir}/v.html"],
     "is not a .csv file; expected the table latentcode probe wrote"),
    ("view-out-not-html", ["view", "{fuzzy.h5}", "--out", "{a_dir}/v.png"],
     "does not end in .html; expected the name of the HTML page to write"),
    ("view-max-instances-0", ["view", "{fuzzy.h5}", "--max-instances", "0"],
     "argument --max-instances: expected a positive integer, got '0'"),
    # the token view (issue 51)
    ("view-serve-port-in-use", ["view", "{tokens.h5}", "--serve", "--port", "{busy_port}"],
     "--port {busy_port}: 127.0.0.1:{busy_port} is not free"),
    ("view-tokens-no-token-ids", ["view", "{fuzzy.h5}", "--view", "tokens", "--out", "{a_dir}/v.html"],
     "{fuzzy.h5} keeps no token ids (/extra/token_ids)"),
    ("view-serve-no-token-ids", ["view", "{fuzzy.h5}", "--serve"], "{fuzzy.h5} keeps no token ids (/extra/token_ids)"),
    ("view-serve-no-compact-store", ["view", "{tokens_no_compact.h5}", "--serve"],
     "{tokens_no_compact.h5} has no compact store (/compact); --serve rebuilds every row from it"),
    # tasks, and the command itself
    ("ambiguity-n-0", ["tasks", "ambiguity", "--n", "0"], "argument --n: expected a positive integer, got '0'"),
    ("ambiguity-values-2", ["tasks", "ambiguity", "--values", "2"], "argument --values: expected an integer of at least 3"),
    ("count-features-1", ["tasks", "count", "--features", "1"], "argument --features: expected an integer of at least 2"),
    ("no-command", [], "the following arguments are required: COMMAND"),
    ("unknown-command", ["frobnicate"], "invalid choice: 'frobnicate'"),
]


# Mistakes found only while the command works (after pandas or matplotlib are imported): answered
# in one line, with nothing changed, too.
FOUND_WHILE_WORKING = [
    ("heatmap-nan-codes", ["heatmap", "{nan_codes.h5}", "--label", "task_index"],
     "{nan_codes.h5}: the codes of layer 1 (site all) contain NaN or inf in 6 of 60 examples"),
]


def expand(text: str, root: Path) -> str:
    """`{name}` -> the workspace path `root/name` (which need not exist); `{..._checkpoint}` -> the
    first 12 hex digits of that checkpoint's SHA-256, kept in the workspace file of that name; `{..._port}`
    -> the port number kept in the workspace file of that name."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        return (root / name).read_text() if name.endswith(("_checkpoint", "_port")) else str(root / name)

    return re.sub(r"\{([^{}]+)\}", value, text)


def test_the_table_covers_the_issue():
    assert len(BAD_INPUTS) >= 40 and len({row[0] for row in BAD_INPUTS}) == len(BAD_INPUTS)


def test_the_table_covers_every_command():
    """A new command gets rows here: its mistakes are answered in one line, before torch."""
    from latentcode.cli import build_parser

    missing = set(build_parser().commands) - {argv[0] for _, argv, _ in BAD_INPUTS if argv}
    assert not missing, f"commands without a row in BAD_INPUTS: {sorted(missing)}"


@pytest.mark.parametrize("argv, message", [row[1:] for row in BAD_INPUTS + FOUND_WHILE_WORKING],
                         ids=[row[0] for row in BAD_INPUTS + FOUND_WHILE_WORKING])
def test_a_bad_input_is_one_line_and_changes_nothing(workspace, monkeypatch, capsys, argv, message):
    if message == CUDA_MISSING and _has_cuda():
        pytest.skip("this machine has CUDA")
    monkeypatch.chdir(workspace)  # so that a default output would land in the workspace too
    monkeypatch.delenv("LATENTCODE_DEBUG", raising=False)
    places = []
    if any("{locked}" in arg for arg in argv):
        places.append(immutable(workspace / "locked"))
    if any("{readonly}" in arg for arg in argv):
        places.append(read_only_file_system(workspace / "readonly"))
    argv = [expand(arg, workspace) for arg in argv]
    before = snapshot(workspace)
    with contextlib.ExitStack() as stack:
        for place in places:
            stack.enter_context(place)
        try:
            status = main(argv)
        except SystemExit as exit:  # argparse's own errors
            status = exit.code
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert status == 2, captured
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert expand(message, workspace) in lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    assert snapshot(workspace) == before, "a failed command changed or added files"


# issue 45: an environment switch set to a value it does not take (LATENTCODE_MKL_CPU_CHECK=off was silently
# ignored): refused in one line before any command runs, whichever command it is.
BAD_SWITCHES = [
    ("mkl-cpu-check-off", "LATENTCODE_MKL_CPU_CHECK", "off", [*TRAIN, "--out", "{a_dir}/t"]),
    ("mkl-cpu-check-answer", "LATENTCODE_MKL_CPU_CHECK", "answer", ["probe", "{fuzzy.h5}"]),
    ("mkl-on-amd-yes", "LATENTCODE_MKL_ON_AMD", "yes", [*TRAIN, "--out", "{a_dir}/t"]),
    ("kernels-off", "LATENTCODE_KERNELS", "off", [*EXTRACT, "--out", "{a_dir}/c.h5"]),
]


@pytest.mark.parametrize("variable, value, argv", [row[1:] for row in BAD_SWITCHES], ids=[row[0] for row in BAD_SWITCHES])
def test_a_switch_set_to_a_value_it_does_not_take_is_one_line_and_changes_nothing(workspace, monkeypatch, capsys,
                                                                                 variable, value, argv):
    from latentcode.switches import SWITCHES

    monkeypatch.chdir(workspace)
    monkeypatch.delenv("LATENTCODE_DEBUG", raising=False)
    monkeypatch.setenv(variable, value)
    before = snapshot(workspace)
    status = main([expand(arg, workspace) for arg in argv])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert status == 2 and captured.out == "", captured
    expected = " or ".join(SWITCHES[variable])
    assert lines == [lines[0]] and lines[0].startswith(f"error: {variable}={value!r} is not a value it takes; "
                                                       f"expected {expected} (or unset)"), captured.err
    assert snapshot(workspace) == before, "a refused command changed or added files"


def test_bad_inputs_are_answered_before_torch_and_scikit_learn_are_imported(workspace):
    """Run in a fresh interpreter: the checks import neither torch nor scikit-learn nor matplotlib."""
    rows = [row for row in BAD_INPUTS if "locked" not in str(row) and "readonly" not in str(row)
            and row[2] != CUDA_MISSING]  # whether a CUDA device is there only torch can say
    script = (
        "import sys, json\n"
        "from latentcode.cli import main\n"
        f"for argv in json.loads({json.dumps(json.dumps([[expand(a, workspace) for a in row[1]] for row in rows]))}):\n"
        "    try:\n"
        "        assert main(argv) == 2\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 2\n"
        "print(sorted(name for name in ('torch', 'sklearn', 'matplotlib', 'pandas', 'transformer_lens') "
        "if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=workspace,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", f"imported: {result.stdout}"
    assert result.stderr.count("\n") == len(rows) and "Traceback" not in result.stderr


# -- issue 23: a second user's planted lock, a full disk, non-finite edits --------------------------------------
def test_extract_refuses_a_planted_lock_link_and_leaves_its_target_alone(workspace, tmp_path, capsys):
    """The victim of a `.c.h5.lock` link used to get its content replaced by the lock holder's JSON."""
    victim = tmp_path / "victim.txt"
    victim.write_text("another user's file\n")
    out = tmp_path / "shared" / "c.h5"
    out.parent.mkdir()
    (out.parent / ".c.h5.lock").symlink_to(victim)
    assert main(["extract", str(workspace / "run"), "--n", "8", "--quiet", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"lock file {out.parent / '.c.h5.lock'} is a symbolic link" in error
    assert victim.read_text() == "another user's file\n" and sorted(p.name for p in out.parent.iterdir()) == [".c.h5.lock"]


def test_extract_on_a_full_disk_is_one_line_and_leaves_nothing(workspace, tmp_path):
    """It used to end in a segmentation fault (status 139) or an abort (134) with h5py tracebacks."""
    small = tmp_path / "small"
    small.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)],
                                           capture_output=True).returncode:
        pytest.skip("needs mount (root, CAP_SYS_ADMIN) for a small file system")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "latentcode.cli", "extract", str(workspace / "run"), "--n", "4096", "--quiet", "--out", str(small / "c.h5")],
            capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
        left = sorted(p.name for p in small.iterdir())
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.count("\n") == 1 and f"cannot write {small / 'c.h5'}: No space left on device" in result.stderr
    assert left == []


@pytest.mark.parametrize("edit", ["SetCode", "AddVector", "ScaleHeads"])
def test_non_finite_edit_values_are_refused(edit):
    """SetCode(nan), AddVector(inf) and ScaleHeads(nan) made every edited output NaN, silently."""
    import torch

    from latentcode.intervention import AddVector, EditError, ScaleHeads, SetCode

    make = {"SetCode": lambda: SetCode([0.0, float("nan"), 1.0]), "AddVector": lambda: AddVector([float("inf"), 0, 0]),
            "ScaleHeads": lambda: ScaleHeads(float("nan"))}[edit]
    with pytest.raises(EditError, match=r"holds 1 NaN or infinite value\(s\) .*; expected finite numbers"):
        make().replacement(torch.zeros(2, 3, 1), [Site(0, 1, 1)])
    optimised = torch.full((3,), float("nan"), requires_grad=True)  # an edit being learned is left alone
    SetCode(optimised).replacement(torch.zeros(2, 3, 1), [Site(0, 1, 1)])


# -- issue 33: the command line and the Python API answer the same mistake with the same string ----------------
def _plan_mistake(command: str, args) -> Exception | None:
    """The mistake the command's plan step finds in its parsed arguments (None: the mistake is one only
    the command line can make, e.g. --set with a NaN, and has no Python-API equivalent)."""
    from latentcode.cli.arguments import parse_assignments
    from latentcode.errors import UsageError
    from latentcode.extraction.plan import plan_extract
    from latentcode.intervention.plan import plan_intervention

    if command == "train":
        return _train_plan_mistake(args)
    if command in ANALYSIS_PLANS:
        try:
            ANALYSIS_PLANS[command][0](args)
        except Exception as error:  # noqa: BLE001 - returned to be compared
            return error
        return None
    if command == "patch":
        from latentcode.intervention.patching.plan import plan_patch

        try:
            plan_patch(args.run, **_patch_options(args))
        except Exception as error:  # noqa: BLE001 - returned to be compared
            return error
        return None
    try:
        task = parse_assignments(args.task, "--task") or None
    except UsageError:  # KEY=VALUE syntax: the command line's own
        return None
    try:
        if command == "extract":
            plan_extract(args.run, task, args.sites, args.split, args.n, args.out, variant=args.variant,
                         batch_size=args.batch_size, seed=args.seed, append=args.append, overwrite=args.overwrite,
                         compression=args.compression, device=args.device, dtype=args.dtype)
        else:
            plan_intervention(args.run, task=task, sites=args.sites, split=args.split, n=args.n, variant=args.variant,
                              batch_size=args.batch_size, seed=args.seed, per_site=not args.no_per_site,
                              device=args.device, dtype=args.dtype)
    except Exception as error:  # noqa: BLE001 - returned to be compared
        return error
    return None


def _patch_options(args) -> dict:
    """`latentcode patch`'s parsed flags as the keyword arguments of `plan_patch` and `patch`."""
    from latentcode.cli.arguments import parse_assignments

    return {"task": parse_assignments(args.task, "--task") or None, "search": args.search, "grid": args.grid, "groups": args.group, "per_head": args.per_head,
            "layers": None if args.layers is None else ",".join(args.layers), "queries": args.queries, "key_blocks": args.key_blocks, "sites": args.sites,
            "n": args.n, "confirm_n": args.confirm_n, "tolerance": args.tolerance, "max_groups": args.max_groups,
            "split": args.split, "variant": args.variant, "prediction": args.prediction, "seed": args.seed,
            "attribution": args.attribution, "out": args.out, "overwrite": args.overwrite, "device": args.device,
            "dtype": args.dtype}


def _public_api_error(command: str, args) -> Exception:
    """The error of the public function a Python user calls (latentcode.extract, intervention_effects,
    latentcode.intervention.patching.patch) with the same arguments; it must raise before any work."""
    import latentcode
    from latentcode.cli.arguments import parse_assignments
    from latentcode.intervention import ZeroAblate, intervention_effects
    from latentcode.intervention.patching import patch

    if command == "train":
        return _train_api_error(args)
    if command in ANALYSIS_PLANS:
        with pytest.raises(Exception) as raised:  # noqa: PT011 - which class is compared below
            ANALYSIS_PLANS[command][1](args)
        return raised.value
    if command == "patch":
        with pytest.raises(Exception) as raised:  # noqa: PT011 - which class is compared below
            patch(args.run, **_patch_options(args))
        return raised.value
    task = parse_assignments(args.task, "--task") or None
    with pytest.raises(Exception) as raised:  # noqa: PT011 - which class is compared below
        if command == "extract":
            options = {} if args.compression is None else {"compression": args.compression}
            latentcode.extract(args.run, task, sites=args.sites, split=args.split, n=args.n, out=args.out,
                               variant=args.variant, batch_size=args.batch_size, seed=args.seed, append=args.append,
                               overwrite=args.overwrite, progress=False, device=args.device, dtype=args.dtype,
                               **options)
        else:
            intervention_effects(args.run, ZeroAblate(), task=task, sites=args.sites, split=args.split, n=args.n,
                                 variant=args.variant, batch_size=args.batch_size, seed=args.seed,
                                 per_site=not args.no_per_site, device=args.device, dtype=args.dtype)
    return raised.value


def _train_overrides(args) -> dict | None:
    """The fields the override flags and --set give (None: a --set the command line's syntax refuses)."""
    from latentcode.cli.arguments import parse_assignments
    from latentcode.cli.train import TRAIN_OVERRIDES
    from latentcode.errors import UsageError

    try:
        assigned = parse_assignments(args.set, "--set")
    except UsageError:
        return None
    flags = {field: getattr(args, field) for _, field, _, _ in TRAIN_OVERRIDES if getattr(args, field) is not None}
    return flags | assigned | ({"compile": True} if args.compile else {})


def _train_cli_only(args) -> str | None:
    """Why a train command line has no Python-API equivalent: latentcode.train takes a config (from
    build_train_config, a dict or a JSON file), an output and resume, never flags beside them."""
    overrides = _train_overrides(args)
    if overrides is None:
        return "--set's KEY=VALUE syntax"
    if args.resume and (args.preset or args.config or overrides or args.out):
        return "flags beside --resume"
    if args.config and (args.preset or overrides):
        return "flags beside --config"
    return None


def _train_plan_mistake(args) -> Exception | None:
    from latentcode.training.plan import plan_train

    if _train_cli_only(args):
        return None
    try:
        plan_train(args.config, args.out, preset=args.preset, scale=args.scale, attention=args.attention,
                   overrides=_train_overrides(args), resume=args.resume, threads=args.threads, device=args.device,
                   dtype=args.dtype)
    except Exception as error:  # noqa: BLE001 - returned to be compared
        return error
    return None


def _train_api_error(args) -> Exception:
    """What a Python user writes for the same run: build_train_config(preset, ...) then train(config,
    out); train(config_file, out); train(resume=run); train() with nothing."""
    import latentcode

    with pytest.raises(Exception) as raised:  # noqa: PT011 - which class is compared below
        placement = {"device": args.device, "dtype": args.dtype}
        if args.resume:
            latentcode.train(resume=args.resume, progress=False, **placement)
        elif args.preset:
            config = latentcode.build_train_config(args.preset, args.scale, args.attention, **_train_overrides(args))
            latentcode.train(config, args.out, progress=False, **placement)
        else:
            latentcode.train(args.config, args.out, progress=False, **placement)
    return raised.value


def _report_options(args) -> dict:
    return {"label": args.label, "fit_split": args.fit_split, "test_split": args.test_split,
            "methods": tuple(args.method or ["tsne"]), "max_points": args.max_points, "title": args.title,
            "overwrite": args.overwrite, "patches": args.patch or (), "max_rows": args.max_rows}


def _plan_report(args):
    from latentcode.analysis.report_plan import plan_report

    return plan_report(args.runs, args.codes or (), args.out, **_report_options(args))


def _build_report(args):
    from latentcode.analysis.report import build_report

    return build_report(args.runs, args.codes or (), args.out, progress=False, **_report_options(args))


def _probe_arguments(args) -> tuple[tuple, dict]:
    """What a Python user passes to decode (or regress) for this command line: no output (they write the
    table themselves), so a mistake about --out is the command line's own."""
    return (args.files, args.label, args.fit_split, args.test_split), {"cv": args.cv, "seed": args.seed}


def _plan_probe(args):
    from latentcode.analysis.probe_plan import plan_probe

    positional, options = _probe_arguments(args)
    return plan_probe(*positional, **options)


def _decode(args):
    from latentcode.analysis import decode, regress

    positional, options = _probe_arguments(args)
    return (regress if args.ridge else decode)(*positional, **options, progress=False)


PICTURES = {"plot": ("plot_embedding", None), "heatmap": ("plot_similarity", "similarity"),
            "samples": ("plot_code_samples", "samples")}


def _picture_arguments(args) -> tuple[str, tuple, dict]:
    """The kind of figure and what a Python user passes to the plotting function: a stem always (the
    command line's default stem needs the label it resolves; a mistake about --out gives --out)."""
    from latentcode.cli.arguments import formats

    kind = PICTURES[args.command][1] or args.method
    stem = args.out or str(Path(args.file).with_suffix("")) + f"_{kind}"
    options = {"split": args.split, "formats": formats(args)}
    if args.command == "samples":
        options["layer"] = args.layer
    return kind, (args.file, args.label, stem), options


def _plan_picture(args):
    from latentcode.analysis.picture_plan import plan_picture

    kind, positional, options = _picture_arguments(args)
    return plan_picture(*positional, kind=kind, overwrite=True, **options)  # the plotting functions replace theirs


def _plot(args):
    import latentcode.analysis

    kind, positional, options = _picture_arguments(args)
    if args.command == "plot":
        options.update(method=args.method, max_points=args.max_points, seed=args.seed, progress=False)
    return getattr(latentcode.analysis, PICTURES[args.command][0])(*positional, **options)


def _reuse_options(args) -> dict:
    return {"codes": f"{args.out}-codes.h5", "n_codes": args.n_codes, "n_pairs": args.n_pairs, "seed": args.seed}


def _plan_reuse(args):
    from latentcode.reuse import plan_reuse

    return plan_reuse(args.run, **_reuse_options(args))


def _code_reuse(args):
    from latentcode.reuse import code_reuse

    return code_reuse(args.run, **_reuse_options(args))


# command: (its plan step as the Python function calls it, the public function a Python user calls), each
# given the parsed arguments
ANALYSIS_PLANS = {"report": (_plan_report, _build_report), "probe": (_plan_probe, _decode),
                  "plot": (_plan_picture, _plot), "heatmap": (_plan_picture, _plot), "samples": (_plan_picture, _plot),
                  "reuse": (_plan_reuse, _code_reuse)}

def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


API_ROWS = [row for row in BAD_INPUTS if row[1] and row[1][0] in ("extract", "intervene", "train", "patch", *ANALYSIS_PLANS)
            and "{locked}" not in str(row) and "{readonly}" not in str(row)]


@pytest.mark.parametrize("argv", [row[1] for row in API_ROWS], ids=[row[0] for row in API_ROWS])
def test_the_python_api_answers_a_mistake_with_the_command_lines_string(workspace, monkeypatch, capsys, argv):
    """For each mistake of the table that the Python API can make too, `latentcode.extract`,
    `intervention_effects`, `latentcode.train` (with `build_train_config` for a preset), `patch`,
    `build_report`, `decode`/`regress`, `plot_embedding`/`plot_similarity`/`plot_code_samples` or
    `code_reuse` raises the same error class with the same message the command line prints
    after its flag (`--split: `, `RUN_DIR `, `--out `, or `--` before a message naming its argument)."""
    from latentcode.cli import build_parser

    monkeypatch.chdir(workspace)
    monkeypatch.delenv("LATENTCODE_DEBUG", raising=False)
    argv = [expand(arg, workspace) for arg in argv]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        capsys.readouterr()
        pytest.skip("argparse refuses it: no Python-API equivalent")
    mistake = _plan_mistake(argv[0], args)
    if mistake is None:
        pytest.skip("a mistake only the command line can make (its own flags)")
    before = snapshot(workspace)
    api_error = _public_api_error(argv[0], args)
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert type(api_error) is type(mistake) and str(api_error) == str(mistake)
    message = str(api_error).replace("\n", "\\n")
    assert line.startswith("error: ") and line.endswith(message), (line, message)
    flag = line[len("error: "):len(line) - len(message)]
    sub = parser.commands.parsers[argv[0]]
    flags = {option for action in sub._actions for option in action.option_strings} | {"RUN_DIR"}
    assert flag in ("", "--") or flag.rstrip(": ") in flags, flag
    assert snapshot(workspace) == before


# -- issue 47: a model type whose attention cannot be read exactly -------------------------------------------------
# Not rows of BAD_INPUTS, which are answered before torch: these are found while the model runs (its first forward).


def test_a_model_type_whose_attention_cannot_be_read_exactly_is_one_line(tmp_path, monkeypatch, capsys):
    """granite_swa applies its attention sinks to its output, not to the probabilities it reports: the two
    disagree, so its codes are refused in one line naming the model type and why, from the command line and
    the Python API alike, and nothing is written."""
    import torch
    import transformers

    import latentcode
    from tests.pretrained_models import VOCAB_SIZE, tiny_tokenizer

    if not hasattr(transformers, "GraniteSWAConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no granite_swa")
    torch.manual_seed(0)
    config = transformers.GraniteSWAConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=48,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
                                           architectures=["GraniteSWAForCausalLM"])
    transformers.GraniteSWAForCausalLM(config).eval().save_pretrained(tmp_path / "granite")
    tiny_tokenizer().save_pretrained(tmp_path / "granite")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()  # transformers' own lines while saving the model
    message = ("granite_swa attention call 0 (model.layers.0.self_attn): its eager attention returns probabilities "
               "without its sinks and applies the sinks to its output instead")
    assert main(["extract", str(tmp_path / "granite"), "--task", "seq_len=16", "--n", "1", "--out", "c.h5",
                 "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines
    with pytest.raises(latentcode.LatentcodeError) as raised:
        latentcode.extract(tmp_path / "granite", task={"seq_len": 16}, n=1, out="c.h5", progress=False)
    assert lines[0] == f"error: {raised.value}"
    assert snapshot(tmp_path) == before
