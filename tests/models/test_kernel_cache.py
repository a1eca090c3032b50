"""The kernel cache is trusted before anything in it is loaded (issues 45 and 46): a library planted under
a kernel's cache name, a symbolic link to one, a cache directory others can write or another user owns,
are refused in one warning line before `dlopen` (a planted library's constructor would write a marker
file: it is never written) and the torch formula runs instead."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

from latentcode.models import fused_gelu, kernel_cache
from latentcode.models.c_kernels import CompiledLibrary

COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(COMPILER is None or not sys.platform.startswith("linux"),
                                reason="needs a C compiler and Linux")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """fused_gelu's library as a fresh object whose cache is tmp_path/cache/kernels; warnings said anew."""
    monkeypatch.setenv("LATENTCODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_cache, "_said", set())
    library = CompiledLibrary("fused_gelu", fused_gelu.SOURCE, fused_gelu.COMPILE_FLAGS, fused_gelu._declare,
                              openmp=True)
    monkeypatch.setattr(fused_gelu, "KERNELS", library)
    return library


def planted_library(tmp_path, marker):
    """A library with gelu's symbols whose constructor writes `marker` when it is loaded."""
    source = tmp_path / "planted.c"
    source.write_text('#include <stdio.h>\n'
                      f'__attribute__((constructor)) static void planted(void) {{ FILE *f = fopen("{marker}", "w"); '
                      'if (f) { fputs("ran", f); fclose(f); } }\n'
                      'void gelu_forward(void) {} void gelu_backward(void) {} void gelu_forward_parts(void) {}\n'
                      'void gelu_backward_parts(void) {} int latentcode_uses_openmp(void) { return 0; }\n')
    library = tmp_path / "planted.so"
    subprocess.run([COMPILER, "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    return library


def the_formula_runs(library):
    """fused_gelu says no, and the training MLP's GELU is F.gelu's to the bit."""
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    assert library.load() is None and not fused_gelu.available(x)
    from latentcode.models.feedforward import MLP

    torch.manual_seed(0)
    mlp = MLP(40, 16).train()
    pre = torch.addmm(mlp.b_in, x, mlp.W_in)
    expected = torch.addmm(mlp.b_out, F.gelu(pre, approximate="tanh"), mlp.W_out)
    assert torch.equal(mlp(x), expected)


def one_warning(capfd, *parts):
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1, lines
    for part in parts:
        assert part in lines[0], lines[0]
    assert lines[0].endswith("the torch formula runs instead")


def test_a_library_built_here_is_loaded_with_its_digest_recorded(fresh, tmp_path, capfd):
    assert fresh.load() is not None and fresh.failure() is None
    directory = tmp_path / "cache" / "kernels"
    assert oct(directory.stat().st_mode & 0o777) == "0o700"
    name = fresh.file_name(fresh.flag_choices[0])
    assert (directory / (name + ".sha256")).read_text().strip() == \
        __import__("hashlib").sha256((directory / name).read_bytes()).hexdigest()
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize("digest", ["none", "of the library built here"])
def test_a_planted_library_is_refused_before_its_constructor_runs(fresh, tmp_path, capfd, digest):
    marker = tmp_path / "constructor-ran"
    planted = planted_library(tmp_path, marker)
    name = fresh.file_name(fresh.flag_choices[0])
    directory = tmp_path / "cache" / "kernels"
    if digest == "none":
        directory.mkdir(parents=True, mode=0o700)
        shutil.copy(planted, directory / name)
        expected = "has no digest recorded when it was built"
    else:  # built here, then replaced: the recorded digest is the genuine one's
        assert fresh.load() is not None
        fresh.forget()
        os.replace(planted, directory / name)
        expected = "differs from the library built here"
    the_formula_runs(fresh)
    assert not marker.exists(), "the planted library was loaded: its constructor ran"
    one_warning(capfd, str(directory / name), expected)
    assert fresh.failure() is not None and expected in fresh.failure()


def test_a_symbolic_link_under_the_cache_name_is_refused(fresh, tmp_path, capfd):
    marker = tmp_path / "constructor-ran"
    planted = planted_library(tmp_path, marker)
    assert fresh.load() is not None  # a genuine build, with its digest, then the library swapped for a link
    fresh.forget()
    name = fresh.file_name(fresh.flag_choices[0])
    library_path = tmp_path / "cache" / "kernels" / name
    library_path.unlink()
    library_path.symlink_to(planted)
    the_formula_runs(fresh)
    assert not marker.exists()
    one_warning(capfd, f"{library_path} is a symbolic link")


def test_a_cache_directory_that_is_a_link_is_refused(fresh, tmp_path, capfd):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "kernels").symlink_to(elsewhere)
    the_formula_runs(fresh)
    assert not list(elsewhere.iterdir()), "nothing was built through the link"
    one_warning(capfd, "is a symbolic link")


def test_a_cache_directory_others_can_write_is_refused(fresh, tmp_path, capfd):
    marker = tmp_path / "constructor-ran"
    directory = tmp_path / "cache" / "kernels"
    directory.mkdir(parents=True)
    directory.chmod(0o777)  # a shared team directory
    shutil.copy(planted_library(tmp_path, marker), directory / fresh.file_name(fresh.flag_choices[0]))
    the_formula_runs(fresh)
    assert not marker.exists()
    one_warning(capfd, f"the kernel cache {directory} is writable by others (mode 0777)")
    the_formula_runs(fresh)  # asked again: the same answer, said once
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_a_cache_directory_another_user_owns_is_refused(fresh, tmp_path, capfd):
    import pwd

    nobody = pwd.getpwnam("nobody")
    marker = tmp_path / "constructor-ran"
    directory = tmp_path / "cache" / "kernels"
    directory.mkdir(parents=True, mode=0o755)
    shutil.copy(planted_library(tmp_path, marker), directory / fresh.file_name(fresh.flag_choices[0]))
    os.chown(directory, nobody.pw_uid, nobody.pw_gid)
    the_formula_runs(fresh)
    assert not marker.exists()
    one_warning(capfd, f"the kernel cache {directory} is owned by nobody (uid {nobody.pw_uid}), not by you")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_a_library_another_user_owns_is_refused(fresh, tmp_path, capfd):
    import pwd

    assert fresh.load() is not None
    fresh.forget()
    library_path = tmp_path / "cache" / "kernels" / fresh.file_name(fresh.flag_choices[0])
    os.chown(library_path, pwd.getpwnam("nobody").pw_uid, -1)
    the_formula_runs(fresh)
    one_warning(capfd, f"{library_path} is owned by nobody")


def test_the_formula_switch_builds_and_loads_nothing(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("LATENTCODE_KERNELS", "formula")
    the_formula_runs(fresh)
    assert fresh.failure() == "LATENTCODE_KERNELS=formula"
    assert not (tmp_path / "cache").exists()
    monkeypatch.delenv("LATENTCODE_KERNELS")
    assert fresh.load() is not None
