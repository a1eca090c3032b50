"""Device and dtype (issue 47 item 3): a pretrained model runs where and in what it is asked; codes
are float32 whatever the model's dtype (the file's `model_dtype` says which it ran in); a device or
dtype that cannot be used is one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import latentcode
from latentcode.errors import UsageError
from tests.pretrained_models import save_tiny_llama

# bfloat16 keeps 8 significant bits: every weight and activation is off by up to 2^-9 of itself, and the
# errors compound through the layers; a code (a probability in [0, 1]) of this two-layer model moves by
# up to a few hundredths (0.08 with weights of std 0.5, 1e-5 with std 0.02): 5e-2 is the bound stated.
BFLOAT16_TOLERANCE = 5e-2
SEQ_LEN = 32


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    # Weights of std 0.1 rather than 0.02: peaked attention, so bfloat16's rounding shows in the codes.
    return save_tiny_llama(tmp_path_factory.mktemp("llama") / "llama", initializer_range=0.1)


def test_bfloat16_extraction_on_the_cpu_is_within_tolerance_of_float32(llama):
    options = {"task": {"seq_len": SEQ_LEN}, "sites": "*:-1:*", "n": 2, "progress": False}
    single = latentcode.extract(llama, **options)
    half = latentcode.extract(llama, dtype="bfloat16", **options)
    assert (single.attrs["model_dtype"], half.attrs["model_dtype"]) == ("float32", "bfloat16")
    differences = []
    for site in single.sites:
        codes = half.codes(site)
        assert codes.dtype == np.float32
        differences.append(np.abs(codes - single.codes(site)).max())
    assert 0 < max(differences) < BFLOAT16_TOLERANCE, "bfloat16 differs from float32, by less than the tolerance"
    for layer in single.compact.layers:  # the compact store's rebuilt codes too
        rebuilt = half.compact.rows(layer, range(SEQ_LEN))
        assert rebuilt.dtype == np.float32
        np.testing.assert_allclose(rebuilt, single.compact.rows(layer, range(SEQ_LEN)), atol=BFLOAT16_TOLERANCE)
    # The bfloat16 model's own last-token attention (eager, independent of the source) agrees too.
    model = latentcode.load_pretrained(llama, dtype=torch.bfloat16).model
    assert next(model.parameters()).dtype == torch.bfloat16
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(torch.from_numpy(half.extra("token_ids")), output_attentions=True).attentions
    for site in half.sites:
        expected = attentions[site.layer][:, :, site.query, site.key].float().numpy()
        np.testing.assert_allclose(half.codes(site), expected, atol=BFLOAT16_TOLERANCE)


@pytest.mark.parametrize("dtype", ["float8", "int8", torch.float64])
def test_a_dtype_models_do_not_run_in_is_one_line(llama, dtype):
    for call in (lambda: latentcode.load_pretrained(llama, dtype=dtype),
                 lambda: latentcode.extract(llama, task={"seq_len": 8}, n=1, dtype=dtype, progress=False)):
        with pytest.raises(UsageError, match=r"dtype .* is not one the models run in; expected one of float32, "
                                             r"bfloat16, float16") as raised:
            call()
        assert "\n" not in str(raised.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_it_is_one_line(llama, tmp_path):
    with pytest.raises(UsageError, match=r"device 'cuda': this machine has no CUDA device "
                                         r"\(torch.cuda.is_available\(\) is False\); expected cpu"):
        latentcode.load_pretrained(llama, device="cuda")
    with pytest.raises(UsageError, match=r"device 'gpu' is not a device name; expected cpu, cuda, cuda:N"):
        latentcode.extract(llama, task={"seq_len": 8}, n=1, device="gpu", progress=False)
    from latentcode.cli import main

    out = tmp_path / "codes.h5"
    assert main(["extract", str(llama), "--task", "seq_len=8", "--n", "1", "--out", str(out), "--device", "cuda",
                 "--quiet"]) == 2
    assert not out.exists()


def test_the_command_line_refuses_a_dtype_in_one_line(llama, tmp_path, capsys):
    from latentcode.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["extract", str(llama), "--n", "1", "--out", str(tmp_path / "codes.h5"), "--dtype", "float8"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith("error: argument --dtype: invalid choice: 'float8' (choose from 'float32', "
                                "'bfloat16', 'float16')")


@pytest.mark.slow
def test_smollm2_in_bfloat16_on_the_cpu_is_within_tolerance_of_float32(smollm2):
    options = {"task": {"seq_len": 128}, "sites": "*:-1:*", "n": 1, "progress": False}
    single = latentcode.extract("smollm2", **options)
    half = latentcode.extract("smollm2", dtype="bfloat16", **options)
    assert half.attrs["model_dtype"] == "bfloat16"
    worst = max(float(np.abs(half.codes(site) - single.codes(site)).max()) for site in single.sites)
    assert 0 < worst < 0.05, worst  # 30 layers of bfloat16 against float32
