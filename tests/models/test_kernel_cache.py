"""The kernel cache is trusted before anything in it is loaded (issues 45 and 46): a library planted under
the extension's name in its build directory (without a digest, or with the digest of the library built
here), a symbolic link to one, a build directory that is a link, a cache or build directory others can
write or another user owns, are refused in one warning line before `dlopen` (a planted library's
constructor would write a marker file: it is never written) and the torch formula runs instead; a build
that fails (no compiler) and `LATENTCODE_KERNELS=formula` take the formula too."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from latentcode.models import fused_gelu, kernel_cache
from latentcode.models.kernel_ops import EXTENSION, NAME, build_name

COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(COMPILER is None or not sys.platform.startswith("linux"),
                                reason="needs a C compiler and Linux")
LIBRARY = f"{NAME}.so"


@pytest.fixture
def fresh(tmp_path, monkeypatch, kernels):
    """The extension looked at anew with its cache in tmp_path/cache/kernels (warnings said anew); afterwards
    it looks at the session's cache again (whose library is loaded already)."""
    monkeypatch.setenv("LATENTCODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_cache, "_said", set())
    EXTENSION.forget()
    yield tmp_path / "cache" / "kernels" / build_name()
    EXTENSION.forget()


def session_build():
    """The build directory of the session's cache (tests/conftest.py), where the `kernels` fixture built."""
    return Path(os.environ["LATENTCODE_TEST_CACHE"]) / "kernels" / build_name()


def planted_library(tmp_path, marker):
    """A library whose constructor writes `marker` when it is loaded."""
    source = tmp_path / "planted.c"
    source.write_text('#include <stdio.h>\n'
                      f'__attribute__((constructor)) static void planted(void) {{ FILE *f = fopen("{marker}", "w"); '
                      'if (f) { fputs("ran", f); fclose(f); } }\n')
    library = tmp_path / "planted.so"
    subprocess.run([COMPILER, "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    return library


def the_formula_runs():
    """The extension says no, and the training MLP's GELU is F.gelu's to the bit."""
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    assert EXTENSION.load() is None and not fused_gelu.available(x)
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


def test_the_library_built_here_has_its_digest_recorded_in_private_directories(kernels, capfd):
    build = session_build()
    for directory in (build.parent, build):
        assert oct(directory.stat().st_mode & 0o777) == "0o700"
    assert (build / (LIBRARY + ".sha256")).read_text().strip() == hashlib.sha256((build / LIBRARY).read_bytes()).hexdigest()
    assert EXTENSION.load() is not None and EXTENSION.failure() is None
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize("digest", ["none", "of the library built here"])
def test_a_planted_library_is_refused_before_its_constructor_runs(fresh, tmp_path, capfd, digest):
    marker = tmp_path / "constructor-ran"
    fresh.mkdir(parents=True, mode=0o700)
    fresh.parent.chmod(0o700)
    shutil.copy(planted_library(tmp_path, marker), fresh / LIBRARY)
    if digest == "none":
        expected = "has no digest recorded when it was built"
    else:  # the genuine library's recorded digest beside a planted library
        shutil.copy(session_build() / (LIBRARY + ".sha256"), fresh / (LIBRARY + ".sha256"))
        expected = "differs from the library built here"
    the_formula_runs()
    assert not marker.exists(), "the planted library was loaded: its constructor ran"
    one_warning(capfd, str(fresh / LIBRARY), expected)
    assert expected in EXTENSION.failure()


def test_a_symbolic_link_under_the_library_name_is_refused(fresh, tmp_path, capfd):
    marker = tmp_path / "constructor-ran"
    fresh.mkdir(parents=True, mode=0o700)
    fresh.parent.chmod(0o700)
    shutil.copy(session_build() / (LIBRARY + ".sha256"), fresh / (LIBRARY + ".sha256"))
    (fresh / LIBRARY).symlink_to(planted_library(tmp_path, marker))
    the_formula_runs()
    assert not marker.exists()
    one_warning(capfd, f"{fresh / LIBRARY} is a symbolic link")


@pytest.mark.parametrize("which", ["cache", "build directory"])
def test_a_directory_that_is_a_link_is_refused(fresh, tmp_path, capfd, which):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    link = fresh.parent if which == "cache" else fresh
    link.parent.mkdir(parents=True, mode=0o700)
    link.symlink_to(elsewhere)
    the_formula_runs()
    assert not list(elsewhere.iterdir()), "nothing was built through the link"
    one_warning(capfd, f"{link} is a symbolic link")


@pytest.mark.parametrize("which", ["cache", "build directory"])
def test_a_directory_others_can_write_is_refused(fresh, tmp_path, capfd, which):
    marker = tmp_path / "constructor-ran"
    fresh.mkdir(parents=True, mode=0o700)
    fresh.parent.chmod(0o700)
    shutil.copy(planted_library(tmp_path, marker), fresh / LIBRARY)
    shared = fresh.parent if which == "cache" else fresh
    shared.chmod(0o777)  # a shared team directory
    the_formula_runs()
    assert not marker.exists()
    one_warning(capfd, f"the kernel cache {shared} is writable by others (mode 0777)")
    the_formula_runs()  # asked again: the same answer, said once
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]


def test_a_cache_directory_another_user_owns_is_refused(fresh, tmp_path, capfd, monkeypatch):
    """Another owner, faked: the process's effective uid made one that owns nothing here (as root, the real
    chown is tested below)."""
    marker = tmp_path / "constructor-ran"
    fresh.mkdir(parents=True, mode=0o700)
    shutil.copy(planted_library(tmp_path, marker), fresh / LIBRARY)
    real = os.geteuid()
    monkeypatch.setattr(kernel_cache.os, "geteuid", lambda: real + 4242)
    the_formula_runs()
    assert not marker.exists()
    one_warning(capfd, f"the kernel cache {fresh.parent} is owned by", f"not by you (uid {real + 4242})")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("which", ["build directory", "library"])
def test_a_build_directory_or_library_another_user_owns_is_refused(fresh, tmp_path, capfd, which):
    import pwd

    nobody = pwd.getpwnam("nobody")
    fresh.mkdir(parents=True, mode=0o700)
    fresh.parent.chmod(0o700)
    shutil.copytree(session_build(), fresh, dirs_exist_ok=True)  # the genuine library and its digest
    owned = fresh if which == "build directory" else fresh / LIBRARY
    os.chown(owned, nobody.pw_uid, nobody.pw_gid)
    the_formula_runs()
    one_warning(capfd, f"{owned} is owned by nobody (uid {nobody.pw_uid})")


def test_a_copy_of_the_genuine_build_is_loaded(fresh, capfd):
    """The checks refuse what they should only: the library built here, copied with its digest into another
    cache of the user's own, passes them (its operators are the ones loaded already)."""
    fresh.parent.mkdir(parents=True, mode=0o700)
    shutil.copytree(session_build(), fresh)
    assert EXTENSION.load() is not None and EXTENSION.failure() is None
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]


def test_the_formula_switch_builds_and_loads_nothing(fresh, tmp_path, monkeypatch):
    monkeypatch.setenv("LATENTCODE_KERNELS", "formula")
    the_formula_runs()
    assert EXTENSION.failure() == "LATENTCODE_KERNELS=formula"
    assert not (tmp_path / "cache").exists()


def test_without_a_compiler_the_build_fails_and_training_takes_the_formula(tmp_path):
    """In a fresh process (one that has the operators loaded never builds a second copy), its C++ compiler
    missing: no library is left to load, the failure is said, the MLP and attention take their formulas."""
    script = (
        "import torch\n"
        "from latentcode.models import fused_gelu, fused_short\n"
        "from latentcode.models.feedforward import MLP\n"
        "x = torch.randn(3, 8)\n"
        "print('loaded', fused_gelu.KERNELS.load() is not None, fused_gelu.available(x))\n"
        "print('failure', fused_gelu.KERNELS.failure())\n"
        "print('why', fused_short.why_not(x, 8))\n"
        "MLP(8, 4).train()(x)\n"
    )
    environment = {**os.environ, "LATENTCODE_CACHE": str(tmp_path / "cache"), "CXX": str(tmp_path / "no-such-compiler")}
    result = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "loaded False False"
    assert lines[1].startswith("failure the kernels could not be built") and len(lines[1]) < 500, lines[1]
    assert lines[2].startswith("why its kernels are not loaded: the kernels could not be built")
    assert not list((tmp_path / "cache").rglob("*.so")), "nothing half-built is left to load"
    # on stderr: the build announced once, and its failure one warning line, once
    err = result.stderr.splitlines()
    assert sum(line.startswith("latentcode: building its CPU kernels once") for line in err) == 1, result.stderr
    warnings = [line for line in err if line.startswith("warning: the kernels could not be built")]
    assert len(warnings) == 1 and warnings[0].endswith("the torch formula runs instead"), result.stderr
