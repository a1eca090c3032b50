"""Device and dtype of intervene, patch (sweep, search, attribution), qk and train (issue 47 item 3):
each runs its model in the dtype asked for, its inputs following the model's device; in bfloat16 its
results are within the tolerances below of float32, and a device or dtype that cannot be used is one
line, from Python and the command line alike, before anything is written.

Tolerances, and why. bfloat16 keeps 8 significant bits: each product or sum is rounded by up to 2^-9
(0.2 %) of itself, and a model's layers add such roundings up. Stated once for every test here:

- codes and other values on a known scale (a query-key score): within `SCALE_TOLERANCE` = 2 % of the
  largest float32 value of their kind (measured: 1.2 % on the shipped sraven-hyla, whose
  RMS-normalised codes reach 3.6);
- attribution estimates (of one (head, query, key) pair, or summed over a group of pairs): within
  `ATTRIBUTION_TOLERANCE` = 10 % of the largest float32 one: each is a gradient times (donor code -
  base code), a difference of two codes each rounded by up to 2^-9 of itself (about 0.007 for codes
  near 3.6), as large as many of the differences themselves (measured: 7.4 % for single pairs on 64
  SRAVEN pairs at layer 2; 3.0 % for the sums over the row groups of layer 2 on 32 pairs, 0.7 % on 64);
- effects (the change an edit or patch makes, and the values before and after it): within
  `SE_TOLERANCE` = half the effect's own standard error, so the dtype changes no conclusion the
  float32 run allows (measured: 0.14 of it on the tiny Llama's resample ablation, 0.03 or less elsewhere).

Each test fails where the dtype were ignored: a forward hook on every module sees the parameters
that ran (`parameter_dtypes`), and the bfloat16 results must differ from float32's (by more than 0).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import latentcode
from latentcode.errors import UsageError
from latentcode.intervention import ZeroAblate, intervention_effects
from latentcode.intervention.patching import attribution_patching, patch
from latentcode.intervention.qk import qk_attribution
from tests.pretrained_models import save_tiny_llama

SCALE_TOLERANCE = 0.02  # of the largest float32 value of the kind
SE_TOLERANCE = 0.5  # of the effect's standard error
ATTRIBUTION_TOLERANCE = 0.1  # of the largest float32 attribution estimate (of a pair or a group of pairs)
MODELS = Path(__file__).resolve().parents[2] / "models"
SRAVEN, FUZZY = str(MODELS / "sraven-hyla"), str(MODELS / "fuzzy_logic-hyla")


@contextlib.contextmanager
def parameter_dtypes():
    """The dtypes of the parameters of every module that ran a forward pass in the block (a set)."""
    seen: set = set()

    def hook(module, inputs, output):
        seen.update(parameter.dtype for parameter in module.parameters(recurse=False))

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    # Weights of std 0.1 rather than 0.02: peaked attention, so bfloat16's rounding shows.
    return str(save_tiny_llama(tmp_path_factory.mktemp("llama") / "llama", initializer_range=0.1))


def within_se(single, half, value: str, se: str) -> float:
    """max |bfloat16 - float32| of column `value` over the rows, checked against half its standard error."""
    difference = np.abs(half[value].to_numpy(float) - single[value].to_numpy(float))
    bound = SE_TOLERANCE * single[se].to_numpy(float)
    assert (difference <= bound).all(), (value, difference, bound)
    return float(difference.max())


def test_intervene_in_bfloat16_is_within_tolerance_of_float32():
    options = {"sites": "last-self", "n": 128, "per_site": False}
    single = intervention_effects(FUZZY, ZeroAblate(), **options)
    with parameter_dtypes() as seen:
        half = intervention_effects(FUZZY, ZeroAblate(), dtype="bfloat16", **options)
    assert seen == {torch.bfloat16}, seen
    differences = [within_se(single, half, value, f"{value} se") for value in ("before", "after", "change")]
    assert max(differences) > 0, "bfloat16 gave float32's numbers exactly: the dtype was ignored"
    assert set(single["model_dtype"]) == {"float32"} and set(half["model_dtype"]) == {"bfloat16"}  # the table says so


def test_intervene_a_pretrained_model_in_bfloat16(llama):
    options = {"sites": "1:*:*", "task": {"seq_len": 32}, "n": 8, "per_site": False}
    single = intervention_effects(llama, ZeroAblate(heads=[0]), **options)
    with parameter_dtypes() as seen:
        half = intervention_effects(llama, ZeroAblate(heads=[0]), dtype="bfloat16", **options)
    assert seen == {torch.bfloat16}, seen
    losses = [frame[frame["metric"] == "next-token loss"] for frame in (single, half)]
    assert within_se(*losses, "change", "change se") > 0
    assert set(half["model_dtype"]) == {"bfloat16"} and set(half["device"]) == {"cpu"}


def test_patch_and_attribution_in_bfloat16_are_within_tolerance_of_float32():
    options = {"grid": "rows", "layers": [2], "queries": "-1", "key_blocks": 2, "n": 32, "attribution": True}
    single = patch(SRAVEN, **options)
    with parameter_dtypes() as seen:
        half = patch(SRAVEN, dtype="bfloat16", **options)
    assert seen == {torch.bfloat16}, seen
    assert (single.summary["model_dtype"], half.summary["model_dtype"]) == ("float32", "bfloat16")
    logit = within_se(single.table, half.table, "logit_difference (different)", "logit_difference (different) se")
    estimates = [result.table["attribution estimate"].to_numpy() for result in (single, half)]
    difference = np.abs(estimates[1] - estimates[0]).max()
    assert 0 < difference <= ATTRIBUTION_TOLERANCE * np.abs(estimates[0]).max(), difference
    assert logit > 0


def test_patch_search_runs_in_bfloat16():
    with parameter_dtypes() as seen:
        result = patch(SRAVEN, search=True, layers=[2], n=16, confirm_n=16, dtype="bfloat16")
    assert seen == {torch.bfloat16} and result.summary["model_dtype"] == "bfloat16"
    assert np.isfinite(result.table["transfer"].to_numpy(float)).all()


def test_patch_a_pretrained_model_in_bfloat16(llama):
    options = {"task": {"seq_len": 32}, "layers": [1], "n": 4, "attribution": True}
    single = patch(llama, **options)
    with parameter_dtypes() as seen:
        half = patch(llama, dtype="bfloat16", **options)
    assert seen == {torch.bfloat16} and half.summary["model_dtype"] == "bfloat16"
    assert within_se(single.table, half.table, "change", "change se") > 0


def test_attribution_patching_moves_and_casts_a_model_object():
    from latentcode.intervention.transfer import counterfactual_metrics, output_position

    model = latentcode.load_model(f"{SRAVEN}/model").eval()
    task = latentcode.get_task(**json.loads(open(f"{SRAVEN}/config.json").read())["train"]["task"])
    pairs = task.counterfactual_pairs(64, "ood", seed=0)
    metric = counterfactual_metrics(pairs, task.objective, output_position(task, -1))["logit_difference"]
    base, donor = pairs.base.torch().x, pairs.donors["different"].torch().x
    single = attribution_patching(model, base, donor, metric, sites="2:*:*").table()["effect"].to_numpy()
    with parameter_dtypes() as seen:
        half = attribution_patching(model, base, donor, metric, sites="2:*:*", dtype="bfloat16").table()
    assert seen == {torch.bfloat16} and next(model.parameters()).dtype == torch.bfloat16
    difference = np.abs(half["effect"].to_numpy() - single).max()
    assert 0 < difference <= ATTRIBUTION_TOLERANCE * np.abs(single).max(), (difference, np.abs(single).max())


def test_qk_in_bfloat16_is_within_tolerance_of_float32():
    model = latentcode.load_model(f"{SRAVEN}/model").eval()
    task = latentcode.get_task(**json.loads(open(f"{SRAVEN}/config.json").read())["train"]["task"])
    tokens = task.sample(1, "ood", seed=0).x[0]
    single = qk_attribution(model, tokens, 2, 3, "35:*")
    with parameter_dtypes() as seen:
        half = qk_attribution(model, tokens, 2, 3, "35:*", dtype="bfloat16")
    assert seen == {torch.bfloat16}
    assert half.terms.dtype == torch.float32 and half.terms.device.type == "cpu"
    difference = float((half.scores - single.scores).abs().max())
    assert 0 < difference <= SCALE_TOLERANCE * float(single.scores.abs().max()), difference
    # the terms sum to the float32 arithmetic on the bfloat16 model's activations, whose own score rounds
    assert half.relative_error() <= SCALE_TOLERANCE


def test_train_in_bfloat16_autocasts_and_records_it(tmp_path):
    from latentcode.training import build_train_config

    config = build_train_config("fuzzy_logic", "tiny", "hyla", n_train_instances=4 * 128, n_layers=1)
    outputs: set = set()

    def hook(module, inputs, output):
        if type(module).__name__ == "Unembed" and module.training:
            outputs.add((output.dtype, module.W_U.dtype))

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        run = latentcode.train(config, tmp_path / "run", progress=False, dtype="bfloat16", device="cpu")
    finally:
        handle.remove()
    # autocast: the products in bfloat16, the parameters (and the optimizer's state) in float32
    assert outputs == {(torch.bfloat16, torch.float32)}, outputs
    record = json.loads((run.path / "config.json").read_text())
    assert record["train"]["mixed_precision"] == "bf16"
    assert record["compute"]["autocast_dtype"] == "bfloat16" and record["compute"]["dtype"] == "float32"
    assert record["compute"]["device"] == "cpu"
    with pytest.raises(UsageError, match=r"dtype 'bfloat16' computes with mixed_precision 'bf16', but the config "
                                         r"sets mixed_precision 'no'; give one of them"):
        latentcode.train(config.replace(mixed_precision="no"), tmp_path / "other", dtype="bfloat16")
    assert not (tmp_path / "other").exists()


def _entry_points(llama, tmp_path):
    """Each Python entry point that runs a model, as a function of (device, dtype)."""
    model = latentcode.load_model(f"{SRAVEN}/model").eval()
    tokens = torch.zeros(4, dtype=torch.long)
    return {
        "extract": lambda device, dtype: latentcode.extract(SRAVEN, n=1, device=device, dtype=dtype, progress=False),
        "intervene": lambda device, dtype: intervention_effects(SRAVEN, ZeroAblate(), n=1, device=device, dtype=dtype),
        "intervene-pretrained": lambda device, dtype: intervention_effects(llama, ZeroAblate(), task={"seq_len": 8},
                                                                           n=1, device=device, dtype=dtype),
        "patch": lambda device, dtype: patch(SRAVEN, n=2, device=device, dtype=dtype),
        "patch-search": lambda device, dtype: patch(SRAVEN, search=True, device=device, dtype=dtype),
        "patch-pretrained": lambda device, dtype: patch(llama, task={"seq_len": 8}, device=device, dtype=dtype),
        "attribution": lambda device, dtype: attribution_patching(model, tokens, tokens, lambda out: out.sum(),
                                                                  device=device, dtype=dtype),
        "qk": lambda device, dtype: qk_attribution(model, tokens, 0, 0, device=device, dtype=dtype),
        "train": lambda device, dtype: latentcode.train(latentcode.build_train_config("fuzzy_logic", "tiny"),
                                                        tmp_path / "run", device=device, dtype=dtype),
    }


REFUSALS = [
    (None, "float8", r"dtype 'float8' is not one the models run in; expected one of float32, bfloat16, float16"),
    (None, torch.float64, r"dtype torch.float64 is not one the models run in; expected one of float32, bfloat16"),
    ("tpu", None, r"device 'tpu' is not a device name; expected cpu, cuda, cuda:N \(N a GPU's number\), mps or xpu"),
    pytest.param("cuda", None, r"device 'cuda': this machine has no CUDA device \(torch.cuda.is_available\(\) is "
                 r"False\); expected cpu", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA here")),
]


@pytest.mark.parametrize("device, dtype, message", REFUSALS)
def test_every_entry_point_refuses_a_device_or_dtype_in_one_line(llama, tmp_path, device, dtype, message):
    for name, call in _entry_points(llama, tmp_path).items():
        with pytest.raises(UsageError, match=message) as raised:
            call(device, dtype)
        assert "\n" not in str(raised.value), name
    assert list(tmp_path.iterdir()) == [], "a refused call wrote something"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_refused_command_keeps_what_is_at_its_output(llama, tmp_path, capsys):
    """--device cuda without CUDA, even with --overwrite: one line, and the outputs already there unchanged."""
    from latentcode.cli import main

    stem = tmp_path / "mine"
    for suffix in (".csv", ".json", ".png", ".h5"):
        stem.with_suffix(suffix).write_text(f"the user's own {suffix}")
    (tmp_path / "qk").mkdir()
    (tmp_path / "qk" / "qk.csv").write_text("the user's own table")
    (tmp_path / "run").mkdir()
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    commands = [
        ["extract", SRAVEN, "--n", "1", "--out", f"{stem}.h5", "--overwrite"],
        ["intervene", SRAVEN, "--zero-ablate", "all", "--out", str(stem), "--overwrite"],
        ["intervene", llama, "--zero-ablate", "all", "--task", "seq_len=8", "--out", str(stem), "--overwrite"],
        ["patch", SRAVEN, "--out", str(stem), "--overwrite"],
        ["patch", SRAVEN, "--search", "--out", str(stem), "--overwrite"],
        ["patch", llama, "--task", "seq_len=8", "--out", str(stem), "--overwrite"],
        ["qk", SRAVEN, "--layer", "0", "--head", "0", "--pairs", "previous", "--out", str(tmp_path / "qk"),
         "--overwrite"],
        ["train", "--preset", "fuzzy_logic", "--scale", "tiny", "--out", str(tmp_path / "run" / "new")],
    ]
    for argv in commands:
        assert main([*argv, "--device", "cuda"]) == 2, argv
        error = capsys.readouterr().err.strip().splitlines()
        assert error == ["error: --device 'cuda': this machine has no CUDA device (torch.cuda.is_available() is "
                         "False); expected cpu"], (argv, error)
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
    assert not (tmp_path / "run" / "new").exists()
