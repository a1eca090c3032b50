"""MKL's CPU check answered on AMD CPUs (`latentcode.models.mkl_on_amd`): the offset-table slots it finds
are the ones `readelf` lists for the symbol; on an AMD CPU with torch's MKL the slot afterwards holds
the answering function, products still equal float64 ones to float32 rounding and a training step
of the paper's model gives the losses of MKL's own path; restoring gives the slot back; it is left
alone unless asked (`latentcode train` without --mkl-on-amd leaves libtorch's slot as it was), on other
vendors, on CPUs without AVX2/FMA, and says why; a switch value it does not take is refused in one line.

The test session never asks (tests/conftest.py drops the switches, so that no test's numbers depend on
which test trained first); the answered path runs in subprocesses."""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from latentcode.models import mkl_on_amd


def run_python(code: str, **environment: str) -> dict:
    env = {key: value for key, value in os.environ.items()
           if key not in (mkl_on_amd.SWITCH_VARIABLE, mkl_on_amd.OLD_SWITCH_VARIABLE)}
    env.update(environment)
    answer = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            env=env, timeout=300)
    assert answer.returncode == 0, answer.stderr[-2000:]
    return json.loads(answer.stdout.strip().splitlines()[-1])


def amd_with_mkl() -> str | None:
    """Why the answered path cannot be exercised here, or None."""
    return mkl_on_amd._why_not_on_this_machine()


def test_the_answer_is_off_unless_asked(monkeypatch):
    assert mkl_on_amd.SWITCH_VARIABLE not in os.environ
    assert not mkl_on_amd.requested()
    assert mkl_on_amd.mkl_setting() == "MKL's own CPU check (the answer on AMD CPUs not asked for)"
    assert not mkl_on_amd.mkl_fast_paths_in_use()
    monkeypatch.setenv(mkl_on_amd.OLD_SWITCH_VARIABLE, "keep")  # the old switch's one value: what is done anyway
    monkeypatch.setenv(mkl_on_amd.SWITCH_VARIABLE, "0")
    assert not mkl_on_amd.requested()
    monkeypatch.setenv(mkl_on_amd.SWITCH_VARIABLE, " 1 ")
    assert mkl_on_amd.requested()


@pytest.mark.parametrize("variable, value, expected", [
    ("LATENTCODE_MKL_ON_AMD", "yes", "LATENTCODE_MKL_ON_AMD='yes' is not a value it takes; expected 0 or 1 (or unset)"),
    ("LATENTCODE_MKL_ON_AMD", "true", "expected 0 or 1"),
    ("LATENTCODE_MKL_CPU_CHECK", "off", "LATENTCODE_MKL_CPU_CHECK='off' is not a value it takes; expected keep (or "
     "unset); MKL's own check is kept unless asked: to answer it on AMD CPUs set LATENTCODE_MKL_ON_AMD=1 or pass "
     "latentcode train --mkl-on-amd"),
    ("LATENTCODE_MKL_CPU_CHECK", "answer", "expected keep"),
])
def test_a_switch_value_it_does_not_take_is_refused_in_one_line(monkeypatch, variable, value, expected):
    from latentcode.switches import SwitchError

    monkeypatch.setenv(variable, value)
    with pytest.raises(SwitchError) as refused:
        mkl_on_amd.requested()
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_the_command_line_refuses_a_bad_switch_before_it_runs(tmp_path):
    env = {**os.environ, "LATENTCODE_MKL_ON_AMD": "on"}
    answer = subprocess.run([sys.executable, "-m", "latentcode.cli", "train", "--preset", "fuzzy_logic", "--scale",
                             "tiny", "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env,
                            timeout=300)
    assert answer.returncode == 2
    assert answer.stderr == ("error: LATENTCODE_MKL_ON_AMD='on' is not a value it takes; expected 0 or 1 (or unset)\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(shutil.which("readelf") is None or platform.machine() != "x86_64", reason="needs readelf on x86-64")
def test_offset_table_slots_are_those_readelf_lists(tmp_path):
    """A library built here that calls two external functions: the slots found for each are exactly the
    relocations readelf prints for that symbol (an independent ELF reader)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    source = tmp_path / "caller.c"
    source.write_text("int outside_one(void); int outside_two(int);\n"
                      "int call_both(int x) { return outside_one() + outside_two(x); }\n"
                      "int (*keep_address(void))(void) { return outside_one; }\n")
    library = tmp_path / "libcaller.so"
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    listing = subprocess.run(["readelf", "-rW", str(library)], capture_output=True, text=True, check=True).stdout
    for symbol in ("outside_one", "outside_two"):
        listed = sorted(int(match.group(1), 16) for match in
                        re.finditer(r"^([0-9a-f]+)\s+\S+\s+R_X86_64_(?:GLOB_DAT|JUMP_SLO)T?\s+\S+\s+" + symbol + r"\b",
                                    listing, re.MULTILINE))
        assert listed, listing
        assert sorted(mkl_on_amd._offset_table_slots(str(library), symbol.encode())) == listed
    assert mkl_on_amd._offset_table_slots(str(library), b"not_called_here") == []


def test_a_file_that_is_not_elf_is_refused_by_name(tmp_path):
    not_elf = tmp_path / "libtorch_cpu.so"
    not_elf.write_bytes(b"#!/bin/sh\n" + bytes(100))
    with pytest.raises(ValueError, match="libtorch_cpu.so is not a little-endian ELF64 x86-64 file"):
        mkl_on_amd._offset_table_slots(str(not_elf), mkl_on_amd.CHECK_SYMBOL)


@pytest.mark.parametrize("vendor, flags, expected", [
    ("GenuineIntel", {"avx2", "fma"}, "the CPU's vendor is GenuineIntel, not AuthenticAMD"),
    ("AuthenticAMD", {"sse2", "avx"}, "the CPU lacks avx2, fma"),
    ("AuthenticAMD", {"avx2"}, "the CPU lacks fma"),
])
def test_left_alone_off_amd_cpus_with_avx2_and_fma(monkeypatch, vendor, flags, expected):
    monkeypatch.setattr(mkl_on_amd, "_cpu", lambda: (vendor, flags))
    monkeypatch.setattr(mkl_on_amd.platform, "system", lambda: "Linux")
    monkeypatch.setattr(mkl_on_amd.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(mkl_on_amd.torch.backends.mkl, "is_available", lambda: True)
    monkeypatch.setattr(mkl_on_amd, "_outcome", None)
    monkeypatch.setattr(mkl_on_amd, "_write_pointer", lambda *args: pytest.fail("wrote a slot"))
    assert mkl_on_amd.use_mkl_fast_paths() == f"MKL's CPU check left as it is: {expected}"
    assert not mkl_on_amd.mkl_fast_paths_in_use()


def test_left_alone_without_mkl(monkeypatch):
    monkeypatch.setattr(mkl_on_amd.platform, "system", lambda: "Linux")
    monkeypatch.setattr(mkl_on_amd.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(mkl_on_amd.torch.backends.mkl, "is_available", lambda: False)
    monkeypatch.setattr(mkl_on_amd, "_outcome", None)
    assert mkl_on_amd.use_mkl_fast_paths() == "MKL's CPU check left as it is: torch is built without MKL"


@pytest.mark.skipif(amd_with_mkl() is not None, reason=f"not an AMD CPU with torch's MKL: {amd_with_mkl()}")
def test_answered_slot_holds_the_answer_products_agree_and_restore_gives_it_back():
    result = run_python("""
        import json, torch
        from latentcode.models import mkl_on_amd as m
        torch.manual_seed(0)
        a, b = torch.randn(4608, 128), torch.randn(128, 256)
        before = m.answered_slot_values()
        outcome = m.use_mkl_fast_paths()
        answered = m.answered_slot_values()
        error = ((a @ b).double() - a.double() @ b.double()).abs().max().item()
        again = m.use_mkl_fast_paths()
        m.restore_mkl_cpu_check()
        print(json.dumps(dict(before=before, outcome=outcome, answered=answered, answer=m.answer_address(),
                              error=error, again=again, restored=m.answered_slot_values(), in_use=m.mkl_fast_paths_in_use())))
    """)
    assert result["outcome"].startswith("MKL's CPU check answered yes for this AMD CPU"), result["outcome"]
    assert result["again"] == result["outcome"]  # once per process
    assert result["answered"] == [result["answer"]] and result["before"] != result["answered"]
    assert result["restored"] == result["before"] and not result["in_use"]
    assert result["error"] < 1e-3  # sums of 128 products of unit normals: float32 rounding is ~1e-5


TRAIN_AND_READ_THE_SLOT = """
    import json, sys
    from latentcode.cli import main
    from latentcode.models import mkl_on_amd as m
    before = m.answered_slot_values()
    status = main(["train", "--preset", "fuzzy_logic", "--scale", "tiny", "--quiet", "--out", sys.argv[1],
                   *sys.argv[2:]])
    print(json.dumps(dict(status=status, before=before, after=m.answered_slot_values(), answer=m.answer_address(),
                          setting=m.mkl_setting())))
"""


def train_and_read_the_slot(out, *flags: str, **environment: str) -> dict:
    env = {key: value for key, value in os.environ.items()
           if key not in (mkl_on_amd.SWITCH_VARIABLE, mkl_on_amd.OLD_SWITCH_VARIABLE)} | environment
    answer = subprocess.run([sys.executable, "-c", textwrap.dedent(TRAIN_AND_READ_THE_SLOT), str(out), *flags],
                            capture_output=True, text=True, env=env, timeout=600)
    assert answer.returncode == 0, answer.stderr[-2000:]
    result = json.loads(answer.stdout.strip().splitlines()[-1])
    assert result["status"] == 0
    return result


@pytest.mark.skipif(amd_with_mkl() is not None, reason=f"only an AMD CPU with torch's MKL has the slot rewritten "
                    f"when asked, so only there does 'untouched' say anything: {amd_with_mkl()}")
def test_latentcode_train_leaves_libtorch_untouched_unless_asked(tmp_path):
    """The slot of libtorch_cpu.so read before and after `latentcode train` in one process: the same pointer
    without the opt-in (and the run records MKL's own check); with --mkl-on-amd or LATENTCODE_MKL_ON_AMD=1
    it holds the answer."""
    plain = train_and_read_the_slot(tmp_path / "plain")
    assert plain["after"] == plain["before"]
    assert plain["setting"].startswith("MKL's own CPU check")
    record = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert record["compute"]["mkl"] == plain["setting"]
    for name, flags, environment in (("flag", ("--mkl-on-amd",), {}), ("variable", (), {"LATENTCODE_MKL_ON_AMD": "1"})):
        asked = train_and_read_the_slot(tmp_path / name, *flags, **environment)
        assert asked["after"] == [asked["answer"]] and asked["before"] != asked["after"]
        assert json.loads((tmp_path / name / "config.json").read_text())["compute"]["mkl"].startswith(
            "MKL's CPU check answered yes")


TRAINING_LOSSES = """
    import json, torch
    torch.set_num_threads(1)
    from latentcode.models import build_model
    from latentcode.models.config import ModelConfig
    from latentcode.models.mkl_on_amd import mkl_fast_paths_in_use, requested, use_mkl_fast_paths
    from latentcode.training.optimizer import build_optimizer
    if requested():
        use_mkl_fast_paths()  # before any product, as `latentcode train --mkl-on-amd` does
    config = ModelConfig(attention="softmax", attn_dropout=0.0, n_layers=2, d_model=64, n_heads=4, kqv_dim=32,
                         d_mlp=128, n_ctx=12, d_in=8, d_out=8)
    model = build_model(config, seed=0).train()
    optimizer = build_optimizer(model, learning_rate=1e-3, weight_decay=0.1)
    generator = torch.Generator().manual_seed(0)
    inputs, targets = torch.rand(64, 12, 8, generator=generator), torch.randn(64, 12, 8, generator=generator)
    losses = []
    for _ in range(5):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(json.dumps(dict(losses=losses, answered=mkl_fast_paths_in_use())))
"""


@pytest.mark.skipif(amd_with_mkl() is not None, reason=f"not an AMD CPU with torch's MKL: {amd_with_mkl()}")
def test_training_steps_give_the_losses_of_mkls_own_path():
    answered = run_python(TRAINING_LOSSES, LATENTCODE_MKL_ON_AMD="1")
    own = run_python(TRAINING_LOSSES)
    assert answered["answered"] and not own["answered"]
    assert answered["losses"] == pytest.approx(own["losses"], rel=1e-4)
    assert answered["losses"][-1] < answered["losses"][0]  # it trains


@pytest.mark.skipif(shutil.which("readelf") is None or platform.system() != "Linux", reason="needs readelf and /proc")
def test_a_loaded_library_is_found_with_its_load_address_even_under_a_path_with_spaces(tmp_path):
    import ctypes

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    directory = tmp_path / "a folder with spaces"
    directory.mkdir()
    source, library = directory / "probe.c", directory / "libprobe_for_maps.so"
    source.write_text("int probe_for_maps(void) { return 7; }\n")
    subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    loaded = ctypes.CDLL(str(library))
    path, base = mkl_on_amd._loaded("libprobe_for_maps.so")
    assert path == str(library)
    function = ctypes.cast(loaded.probe_for_maps, ctypes.c_void_p).value
    symbol_offset = int(re.search(r"([0-9a-f]+)\s+\d+\s+FUNC\s+GLOBAL\s+DEFAULT\s+\d+\s+probe_for_maps\b",
                                  subprocess.run(["readelf", "-sW", str(library)], capture_output=True, text=True,
                                                 check=True).stdout).group(1), 16)
    assert function == base + symbol_offset  # the load address plus the symbol's address in the file
    with pytest.raises(ValueError, match="libnot_loaded_anywhere.so is not loaded"):
        mkl_on_amd._loaded("libnot_loaded_anywhere.so")
