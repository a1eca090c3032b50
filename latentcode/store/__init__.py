"""The HDF5 file of latent codes: schema, streaming atomic writer and reader (h5py and numpy only).

{schema}

Modules: `schema` (the table above, declared once: the writer creates what it lists, validation
checks it, this text is made from it), `writer` (`CodeWriter`), `reader` (`CodeFile`),
`validation` (`validate`, the checks at open), `shards` and `sharded_writer` (sharded files),
`site` (`Site`), `memory` (`InMemoryCodes`: codes in memory, read like a file), `full_disk` (writes that fail late).

All per-example datasets are chunked along N, compressed and resizable; examples are appended in
batches, so a file of a million examples is never held in memory. Every per-example dataset has
the same length N. Compression (`compression=`): "gzip" (default, with byte shuffling: deflate is
part of every HDF5 build, so h5dump, HDFView, netCDF, MATLAB, R and Julia read the file), "lzf"
(somewhat faster, but only h5py ships its filter) or "none". An appended file keeps its own.

A codes file refers to nothing outside itself: the reader refuses external links, virtual datasets
with sources in other files and datasets stored in external raw files, which h5py would otherwise
follow silently (`CodeFile(path, allow_external=True)` reads such a file anyway). The one exception
is a sharded file: `write_sharded_file` (a sharded extraction, one shard per process) writes a file
whose per-example datasets and /split are virtual datasets over the rows of shard files beside it,
named `NAME.shard-RANK-of-WORLD.h5`, listed in its root attribute `shards`; everything else (groups,
attributes, /provenance) is its own, as in any codes file. The reader follows virtual sources only
into the listed shards, and checks at open that each is a regular file beside it (not a link) with
the rows, the `file_id` and every dataset of the shape the list says: HDF5 would read a missing
shard or dataset as fill values without a word, and a shard of another extraction would pass a
row count. Move the shards with the file. A sharded file cannot be appended to.

Writers: one at a time. `CodeWriter` holds the lock `.NAME.lock` beside the file (see
`latentcode.files`) from before it looks at the file until its final rename; a second writer is
refused naming the first (pid, host, since when), or waits `wait_for_lock` seconds if asked.
Atomicity: the writer writes to a temporary file `.NAME.<random>.tmp` next to the target and
renames it over the target only when closed without error. An interrupted extraction leaves no
file under the final name, and when appending, the previous file stays intact (the temporary file
starts as its copy); temporary files of killed writers are removed by the next writer. A new file
gets the mode the process umask gives; an appended or overwritten file keeps its mode. A target
that is a symbolic link (dangling or not), a directory, a device or a FIFO is refused, never
written through or replaced; a full disk is one `WriteError` and leaves nothing behind.

Reading: `CodeFile` checks the file against the schema at open (`validate`: the groups, datasets
and attributes above, their ranks, dtypes and row counts, the JSON attributes and their types)
and refuses a file that differs with one `CodeFileError` naming the dataset or attribute.
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
