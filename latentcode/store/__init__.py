"""The HDF5 file of latent codes: schema, streaming atomic writer and reader (h5py and numpy only).

{schema}

Modules: `schema` (the table above, declared once: the writer creates what it lists, validation
checks it, this text is made from it), `writer` (`CodeWriter`), `reader` (`CodeFile`),
`validation` (`validate`, the checks at open), `shards` and `sharded_writer` (sharded files),
`site` (`Site`), `memory` (`InMemoryCodes`: codes in memory, read like a file), `full_disk` (writes that fail late).

Every per-example dataset has N rows, chunked along N, compressed and resizable; examples are appended
in batches, so a file of a million examples is never held in memory. Compression (`compression=`):
"gzip" (default, with byte shuffling: every HDF5 build, h5dump, HDFView, netCDF, MATLAB, R and Julia
read it), "lzf" (somewhat faster, but only h5py ships its filter) or "none"; an appended file keeps its own.

A codes file refers to nothing outside itself (the reader refuses external links and virtual or
external storage unless `allow_external=True`), except a sharded file over its shards
(`write_sharded_file`, `latentcode.store.shards`). Writers: one at a time, under a lock, through a
temporary renamed over the target on success; details in docs/concepts/codes-file.md.

Reading: `CodeFile` checks the file against the schema at open (`validate`: groups, datasets and
attributes, their ranks, dtypes and row counts, the JSON attributes and their types) and refuses a
file that differs with one `CodeFileError` naming the dataset or attribute.
"""

from __future__ import annotations

from latentcode.store.memory import InMemoryCodes, InMemoryCodesError
from latentcode.store.reader import DEFAULT_MAX_ROWS, CodeFile
from latentcode.store.schema import (
    FORMAT,
    SCHEMA_VERSION,
    SCORE_KINDS,
    CodeFileError,
    documentation,
)
from latentcode.store.sharded_writer import write_sharded_file
from latentcode.store.shards import checked_shards, shard_path
from latentcode.store.site import Site
from latentcode.store.validation import check_readable_hdf5, references_outside, validate
from latentcode.store.writer import COMPRESSIONS, DEFAULT_COMPRESSION, CodeWriter, check_compression

# The schema section of the text above is made from the schema itself, so that it cannot drift.
if __doc__:  # None under python -OO
    __doc__ = __doc__.replace("{schema}", documentation())

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_COMPRESSION",
    "FORMAT",
    "SCHEMA_VERSION",
    "SCORE_KINDS",
    "CodeFile",
    "InMemoryCodes",
    "InMemoryCodesError",
    "DEFAULT_MAX_ROWS",
    "CodeFileError",
    "CodeWriter",
    "Site",
    "check_compression",
    "check_readable_hdf5",
    "checked_shards",
    "references_outside",
    "shard_path",
    "validate",
    "write_sharded_file",
]
