"""Build step that pyproject.toml cannot express: the wheel carries the shipped checkpoints.

The checkpoints live in the repository's top-level `models/` (artifacts beside the code, see
DESIGN.md). A wheel copies each `models/<task>-<attention>/` run directory (model card, configs,
metrics, weights) into `latentcode/shipped_models/`, where `latentcode.shipped` finds them after a
non-editable install; an editable install reads `models/` in place. Everything else is in
pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

MODELS = Path(__file__).resolve().parent / "models"
# What a shipped run directory holds that the demo and a user need (not checkpoints/ or scripts).
SHIPPED_FILES = ("README.md", "config.json", "metrics.jsonl", "summary.json", "model/config.json",
                 "model/model.safetensors")


class BuildWithShippedModels(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install finds models/ in the source tree
        target = Path(self.build_lib) / "latentcode" / "shipped_models"
        for run in sorted(path.parent.parent for path in MODELS.glob("*/model/model.safetensors")):
            for name in SHIPPED_FILES:
                if (run / name).is_file():
                    destination = target / run.name / name
                    self.mkpath(str(destination.parent))
                    self.copy_file(str(run / name), str(destination))


setup(cmdclass={"build_py": BuildWithShippedModels})
