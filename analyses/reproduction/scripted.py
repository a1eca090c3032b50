"""Results that an analysis script makes and the page shows: the script's command on the shipped
models (models/, or --models), run into a scratch folder (analyses/output/, not committed), and the
files of it that are kept, copied into a folder under analyses/results/ (committed) as one set.

    ScriptedResult("rule_swap", "rule_swap.py", (), ("rule_swap.csv", ...), "interventions/rule_swap")
        .command(models, scratch)   the script's command line, printed by every subcommand's --plan
        .run(models, scratch)       runs it (the scripts keep each model's rows in scratch/per_model/,
                                    so a second run only gathers)
        .record(scratch)            copies .kept from the scratch folder into .recorded (RESULTS/...)
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import RESULTS, ROOT


@dataclass(frozen=True)
class ScriptedResult:
    name: str  # the scratch folder's name and the --only choice
    script: str  # under analyses/
    arguments: tuple[str, ...]  # besides --runs-from and --out, as the recorded result was made
    kept: tuple[str, ...]  # the files of the script's --out folder that are recorded
    folder: str  # where they are recorded, under analyses/results/
    quantize_figures: bool = False  # PNGs as 256-colour palettes (how the intervention figures were first kept)

    @property
    def recorded(self) -> Path:
        return RESULTS / self.folder

    def scratch(self, out: str | Path) -> Path:
        return Path(out) / self.name

    def command(self, models: str | Path, out: str | Path) -> list[str]:
        return ["python", f"analyses/{self.script}", "--runs-from", str(models), *self.arguments,
                "--out", str(self.scratch(out))]

    def run(self, models: str | Path, out: str | Path) -> None:
        command = self.command(models, out)
        print(" ".join(command), flush=True)
        subprocess.run([sys.executable, str(ROOT / self.script), *command[2:]], check=True)

    def record(self, out: str | Path) -> list[Path]:
        """Copy the kept files from the scratch folder into analyses/results/FOLDER, as one set."""
        from latentcode.files import AtomicOutputs

        scratch = self.scratch(out)
        with AtomicOutputs(lock=self.recorded / self.name, purpose=f"recording {self.name}") as outputs:
            for kept in self.kept:
                data = (scratch / kept).read_bytes()
                if self.quantize_figures and kept.endswith(".png"):
                    data = palette_png(data)
                outputs.write_bytes(self.recorded / kept, data)
        return [self.recorded / kept for kept in self.kept]


def palette_png(data: bytes) -> bytes:
    """A PNG as 256 colours, no metadata (a third of the size; the figures are flat colours and text)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.open(io.BytesIO(data)).convert("RGB").quantize(256).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def plan_lines(results: Sequence[ScriptedResult], models: str | Path, out: str | Path) -> list[str]:
    """What a subcommand runs and what it writes: each command, then the files it records."""
    lines = []
    for result in results:
        lines.append(" ".join(result.command(models, out)))
        lines += [f"    writes {(result.recorded / kept).relative_to(ROOT.parent)}" for kept in result.kept]
    return lines


def run_and_record(results: Sequence[ScriptedResult], models: str | Path, out: str | Path) -> None:
    for result in results:
        result.run(models, out)
        for path in result.record(out):
            print(f"recorded {path.relative_to(ROOT.parent)}")
