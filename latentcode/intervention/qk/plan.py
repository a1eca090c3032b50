"""What `qk_attribution` and `latentcode qk` check before torch is imported: the outputs (`qk.csv`,
`qk.png` in the output directory) may be written; the pair selector is `latentcode.intervention.qk.pairs`'s."""

from __future__ import annotations

from pathlib import Path

OUTPUTS = ("qk.csv", "qk.png")


def check_outputs(out: str | Path, overwrite: bool) -> list[Path]:
    """The output paths in `out`; refused (FileExistsError, one line) if one exists and not `overwrite`."""
    targets = [Path(out) / name for name in OUTPUTS]
    existing = [str(path) for path in targets if path.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"--out {out}: {', '.join(existing)} already exist; pass overwrite=True (--overwrite) "
                              "to replace them, or choose another --out")
    return targets
