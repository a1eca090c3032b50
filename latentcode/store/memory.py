"""Codes in memory: `InMemoryCodes`, a codes file whose bytes live in memory, read through the same
`CodeFile` interface (sites, codes, labels, extra arrays, the compact store's rebuilds).

    codes = latentcode.extract("runs/sraven-hyla", sites="sraven-rule", n=512, out=None)   # no file
    codes = latentcode.extract(..., split="train", out=codes, append=True)   # a new object: both splits
    codes.codes(codes.sites[0], split="ood")          # [N, H], as CodeFile reads it
    latentcode.decode(codes, label="query_rule")      # every analysis function takes it
    codes.save("codes.h5")                            # the one schema, written atomically

The writer (`CodeWriter(None, ...)`) builds the HDF5 file in memory and the reader opens those
bytes, so a file saved from the object and the object itself are read by one code path and give
identical arrays. The object is not a path: where a file is needed (a command line, `os.fspath`,
`open`) it raises one `InMemoryCodesError` saying to `.save()` it first.
"""

from __future__ import annotations

from pathlib import Path

import h5py

from latentcode.errors import OutputExistsError, UsageError
from latentcode.store.reader import CodeFile
from latentcode.store.validation import open_image, validate
from latentcode.store.writer import MEMORY_NAME


class InMemoryCodes(CodeFile):
    """Codes held in memory (`image`: the bytes of a codes file), read like a `CodeFile`."""

    def __init__(self, image: bytes):
        self.path = Path(MEMORY_NAME)
        self._image = bytes(image)
        self._take(validate(self.path, image=self._image))

    def open_hdf5(self) -> h5py.File:
        return open_image(self._image)

    @property
    def image(self) -> bytes:
        """The bytes of the codes file these codes are (what `save` writes)."""
        return self._image

    @property
    def nbytes(self) -> int:
        """The size of the codes file `save` writes, in bytes."""
        return len(self._image)

    def save(self, path: str | Path, *, overwrite: bool = False) -> CodeFile:
        """Write these codes as a codes file at `path` (atomically, under its lock) and return its reader.
        An existing `path` is refused unless `overwrite=True`. A view (`subsample`) saves every row."""
        from latentcode.files import AtomicOutputs, check_replaceable

        path = Path(path)
        check_replaceable(path)
        with AtomicOutputs(lock=path, purpose="writing latent codes") as outputs:
            if path.exists() and not overwrite:  # looked at under the lock
                raise OutputExistsError(f"{path} already exists; pass overwrite=True to replace it, or choose "
                                        "another path")
            outputs.write_bytes(path, self._image)
        return CodeFile(path)

    def __fspath__(self) -> str:
        raise InMemoryCodesError(
            f"got codes in memory ({len(self)} examples, {len(self.sites)} sites) where a codes file's path is "
            "needed; save them first with codes.save('codes.h5') and pass that path")

    def __repr__(self) -> str:
        return (f"InMemoryCodes({len(self)} examples, splits {self.splits}, {len(self.sites)} sites, "
                f"{self.n_heads} heads, labels {self.label_names}, {self.nbytes / 1e6:.1f} MB)")


class InMemoryCodesError(UsageError, TypeError):
    """Codes in memory handed where a file is needed."""
