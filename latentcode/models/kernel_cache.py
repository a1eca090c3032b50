"""The kernel cache trusted before anything in it is loaded: loading a shared library runs its code.

`dlopen` runs a library's constructors before the caller sees a single symbol, so a library is checked
before it is loaded, never after. A compiled kernel is loaded only where all of these hold:

- the cache directory (`$LATENTCODE_CACHE/kernels`, default `~/.cache/latentcode/kernels`), and the
  build directory in it where there is one (`kernel_ops`), is a directory, not a symbolic link, owned
  by the current user and writable by nobody else (no group or other write bit): no other user can put
  a file in it, rename one or replace one;
- the library is a regular file in it, not a link, owned by the current user and writable by nobody
  else;
- its SHA-256 equals the digest recorded beside it (`NAME.so.sha256`, checked the same way) when it
  was built: a library that was not built here, or was changed since, is not loaded.

Everything is read through one open descriptor of the directory (`openat` with `O_NOFOLLOW`), the
digest is taken from the same open file that is then loaded (`/proc/self/fd/N` on Linux), so nothing
can be swapped between the check and the load. Where a check fails, `UntrustedKernel` says why in one
line; its users print it once as a warning and run the torch formula instead (`kernel_ops`,
`mkl_on_amd`).
A new directory is made with mode 0700; libraries and digests get 0755 and 0644 whatever the umask.
"""

from __future__ import annotations

import errno
import hashlib
import os
import platform
import stat
import sys
from pathlib import Path

DIGEST_SUFFIX = ".sha256"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_said: set[str] = set()


class UntrustedKernel(OSError):
    """The kernel cache, or a library or digest in it, failed a check above; the message says which."""


def warn_once(message: str) -> None:
    """Print `message` as one warning line on stderr, once per process."""
    if message not in _said:
        _said.add(message)
        print(f"warning: {message}; the torch formula runs instead", file=sys.stderr, flush=True)


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check_owned(status: os.stat_result, what: str) -> None:
    if hasattr(os, "geteuid") and status.st_uid != os.geteuid():
        raise UntrustedKernel(f"{what} is owned by {_owner(status.st_uid)}, not by you ({_owner(os.geteuid())}): "
                              "its compiled kernels are not loaded")
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedKernel(f"{what} is writable by others (mode {stat.S_IMODE(status.st_mode):04o}): its compiled "
                              "kernels are not loaded (chmod go-w it, "
                              "or set LATENTCODE_CACHE to a directory of your own)")


def kernel_directory() -> Path:
    """`$LATENTCODE_CACHE/kernels` (default `~/.cache/latentcode/kernels`)."""
    return Path(os.environ.get("LATENTCODE_CACHE") or Path.home() / ".cache" / "latentcode") / "kernels"


def cpu_description() -> str:
    """The machine, the CPU's model and its instruction-set flags (Linux), so that a cache shared by machines
    of one name but other CPUs (containers) never loads a library built for instructions this CPU lacks."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.node()} {platform.machine()} {platform.processor()}"
    flags = " ".join(dict.fromkeys(line for line in lines if line.startswith(("model name", "flags"))))
    return f"{platform.node()} {platform.machine()} {flags}"


def open_trusted_directory(directory: Path, parent_fd: int | None = None) -> int:
    """An open descriptor of `directory`, made (mode 0700) where missing, once it passes the checks above;
    with `parent_fd` (the trusted descriptor of its parent), opened through it."""
    if parent_fd is None:
        directory.parent.mkdir(parents=True, exist_ok=True)
    where = {} if parent_fd is None else {"dir_fd": parent_fd}
    target = directory if parent_fd is None else directory.name
    try:
        os.mkdir(target, 0o700, **where)
    except FileExistsError:
        pass
    try:
        descriptor = os.open(target, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC, **where)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if directory.is_symlink() else "not a directory"
            raise UntrustedKernel(f"the kernel cache {directory} is {kind}: "
                                  "its compiled kernels are not loaded") from None
        raise
    try:
        _check_owned(os.fstat(descriptor), f"the kernel cache {directory}")
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _open_checked(directory_fd: int, name: str, where: Path) -> int | None:
    """An open descriptor of the regular file `name` in the directory, or None where there is none."""
    try:
        descriptor = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0),
                             dir_fd=directory_fd)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UntrustedKernel(f"{where / name} is a symbolic link: it is not loaded") from None
        raise
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise UntrustedKernel(f"{where / name} is not a regular file: it is not loaded")
        _check_owned(status, str(where / name))
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _digest_of(descriptor: int) -> str:
    digest = hashlib.sha256()
    os.lseek(descriptor, 0, os.SEEK_SET)
    while chunk := os.read(descriptor, 1 << 20):
        digest.update(chunk)
    os.lseek(descriptor, 0, os.SEEK_SET)
    return digest.hexdigest()


def open_verified(directory_fd: int, name: str, where: Path) -> int | None:
    """An open descriptor of the library `name` in the trusted directory, its content checked against its
    recorded digest; None where the library is not there (to be built). Raises UntrustedKernel."""
    library = _open_checked(directory_fd, name, where)
    if library is None:
        return None
    try:
        recorded_fd = _open_checked(directory_fd, name + DIGEST_SUFFIX, where)
        if recorded_fd is None:
            raise UntrustedKernel(f"{where / name} has no digest recorded when it was built ({name}{DIGEST_SUFFIX}): "
                                  "it is not loaded (remove it to have it built again)")
        try:
            recorded = os.read(recorded_fd, 200).decode("ascii", "replace").strip()
        finally:
            os.close(recorded_fd)
        if _digest_of(library) != recorded:
            raise UntrustedKernel(f"{where / name} differs from the library built here (its SHA-256 is not the one "
                                  "recorded): it is not loaded (remove it to have it built again)")
    except BaseException:
        os.close(library)
        raise
    return library


def record_digest(library_path: Path, digest_path: Path) -> None:
    """Give a freshly compiled (not yet renamed) library its mode and write its digest file (written to a
    temporary beside it and renamed) to `digest_path`."""
    from latentcode.files import new_temporary_file

    os.chmod(library_path, 0o755)
    with open(library_path, "rb") as file:
        digest = hashlib.file_digest(file, "sha256").hexdigest() if hasattr(hashlib, "file_digest") else \
            hashlib.sha256(file.read()).hexdigest()
    temporary = new_temporary_file(digest_path)
    try:
        temporary.write_text(digest + "\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, digest_path)
    finally:
        temporary.unlink(missing_ok=True)


def loadable_path(descriptor: int, path: Path) -> str:
    """The name to `dlopen` so that the verified open file itself is loaded: `/proc/self/fd/N` on Linux (the
    descriptor must stay open for the process's life: the loader knows the library by that name), else
    `path`."""
    proc = f"/proc/self/fd/{descriptor}"
    return proc if os.path.exists(proc) else str(path)
