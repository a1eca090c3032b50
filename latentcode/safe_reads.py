"""Reading a file that someone else may have planted: the read-side twin of `latentcode.files`.

A report copies and embeds images that another command wrote (`latentcode patch`'s map). In a
directory a second user can write in, `NAME.png` may be a symbolic link to a private file, a FIFO
that blocks the reader for ever, or a file of gigabytes. `read_regular_file` opens without
following a link (`O_NOFOLLOW`, `O_NONBLOCK`), refuses anything but a regular file and checks its
size on the open descriptor before reading it whole; `read_png` also checks that it is a PNG
whose header gives the size of a figure, before the bytes go into a page.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import struct
from pathlib import Path

from latentcode.files import UnsafePath, kind_of

#: larger than any figure latentcode draws (a 30-layer heatmap at 300 dpi is a few MiB)
MAX_FIGURE_BYTES = 64 * 2**20
#: pixels per side of the largest figure latentcode draws, with room to spare
MAX_FIGURE_PIXELS = 32768
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class UnreadableInput(UnsafePath):
    """An input that is not what it should be: too large, of another format, unreadable."""


def prefixed(what: str, path: str | Path) -> str:
    """`what path`, or the path alone where `what` is "" (a plan step's message starts with the value)."""
    return f"{what} {path}" if what else str(path)


def read_regular_file(path: str | Path, what: str, max_bytes: int, check_head=None, head_bytes: int = 0) -> bytes:
    """The bytes of `path`, a regular file of at most `max_bytes`; a link (even to a readable
    file), a directory, a FIFO or a device is refused without being followed or opened for data.
    `check_head(first head_bytes bytes)`, if given, may refuse the file before the rest is read."""
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafePath(f"{prefixed(what, path)} is a symbolic link -> {os.readlink(path)}; latentcode reads only "
                             "regular files and never follows a link; remove it or give the file itself") from None
        raise UnreadableInput(f"cannot read {prefixed(what, path)}: {error.strerror}") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(f"{prefixed(what, path)} is {kind_of(info.st_mode)}; expected a regular file")
        if info.st_size > max_bytes:
            raise UnreadableInput(f"{prefixed(what, path)} has {info.st_size} bytes; expected at most {max_bytes}")
        os.set_blocking(descriptor, True)
        with os.fdopen(descriptor, "rb", closefd=False) as file:
            head = file.read(head_bytes) if check_head is not None else b""
            if check_head is not None:
                check_head(head)
            return head + file.read(max_bytes - len(head))
    finally:
        os.close(descriptor)


def sha256_of_file(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read 1 MiB at a time: a checkpoint's identity (`latentcode.provenance`), a GGUF
    cache entry's key and check (`latentcode.pretrained_cache`)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's signature and IHDR chunk, or None if `data` does not start as a PNG."""
    if len(data) < 24 or not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", data[16:24])


def read_png(path: str | Path, what: str = "image", max_bytes: int = MAX_FIGURE_BYTES,
             max_pixels: int = MAX_FIGURE_PIXELS) -> bytes:
    """The bytes of the PNG `path` (read as `read_regular_file` reads), refused unless it starts
    with the PNG signature and a header of 1 to `max_pixels` pixels a side."""

    def check_head(head: bytes) -> None:
        size = png_size(head)
        if size is None:
            raise UnreadableInput(f"{prefixed(what, path)} is not a PNG image (it starts with {head[:8]!r}); expected "
                                  "a figure written by latentcode")
        width, height = size
        if not (0 < width <= max_pixels and 0 < height <= max_pixels):
            raise UnreadableInput(f"{prefixed(what, path)} is a PNG of {width} x {height} pixels; expected 1 to "
                                  f"{max_pixels} a side")

    return read_regular_file(path, what, max_bytes, check_head, head_bytes=24)
