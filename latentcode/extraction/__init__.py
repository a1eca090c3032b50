"""Record latent codes into files: the recorder and `extract`, on the sources of `latentcode.sources`.

`latentcode.extract(...)` is `latentcode.extraction.pipeline.extract`. Names load their module on
first use, so that importing the package never pays for torch.
"""

from latentcode.lazy import lazy_exports

_WHERE = {
    "extract": "latentcode.extraction.pipeline",
    "run_extraction": "latentcode.extraction.pipeline",
    "ExtractPlan": "latentcode.extraction.plan",
    "plan_extract": "latentcode.extraction.plan",
    "Recorder": "latentcode.extraction.recorder",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
