"""Writes HDF5 could not do: on a full disk h5py reports most failures late, or crashes on close;
these two helpers turn that into one `WriteError` and a clean close."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from pathlib import Path

import h5py

from latentcode.errors import LatentcodeError
from latentcode.files import write_error


def write_nowhere(file: h5py.File) -> None:
    """Point an open file that is being thrown away at an anonymous file in memory, so that closing
    it succeeds whatever HDF5 still has to write (on a full disk, its cached chunks: a close that
    fails leaves HDF5's objects open, and the next h5py call crashes the interpreter, SIGSEGV)."""
    try:
        if not file.id.valid or not hasattr(os, "memfd_create"):
            return
        handle = file.id.get_vfd_handle()
        null = os.memfd_create("latentcode-discarded")  # sparse: extending it costs nothing
    except Exception:  # noqa: BLE001 - another driver, or no handle: close as it is
        return
    try:
        os.dup2(null, handle)
    finally:
        os.close(null)


@contextlib.contextmanager
def failed_writes(path: Path):
    """Raise a WriteError for writes HDF5 could not do: on a full disk h5py reports most of them only
    while freeing its objects, as 'Exception ignored' tracebacks on stderr, and carries on."""
    failures: list[BaseException] = []
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if "h5py" in repr(unraisable.object) and isinstance(unraisable.exc_value, (OSError, RuntimeError)):
            failures.append(unraisable.exc_value)
        else:
            previous(unraisable)

    def print_hook(kind, value, trace) -> None:  # Cython prints the traceback first, through excepthook
        frame = trace
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        if frame is not None and "h5py" in frame.tb_frame.f_code.co_filename:
            return
        previous_print(kind, value, trace)

    previous_print = sys.excepthook
    sys.unraisablehook, sys.excepthook = hook, print_hook
    try:
        yield
    except (OSError, RuntimeError) as error:
        if isinstance(error, LatentcodeError) or (isinstance(error, OSError) and error.errno is None
                                                   and "write" not in str(error)):
            raise
        # Let go of the h5py objects the failed frames hold, now, while the file is open: freed
        # after it is closed (kept alive by the traceback), HDF5 crashes the interpreter (SIGSEGV).
        traceback.clear_frames(error.__traceback__)
        failures.append(error)
    finally:
        sys.unraisablehook, sys.excepthook = previous, previous_print
    if failures:
        failure = write_error(failures[0], path)
        failures.clear()
        raise failure
