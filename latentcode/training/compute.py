"""The compute settings a training session ran with, for its run directory's record.

Results depend, to float rounding, on more than the config: the threads (the kernels' splits and
MKL's), which of the compiled kernels ran or the torch formula instead (`latentcode.models.kernel_ops`),
the allocator setting (`latentcode.allocator`), MKL's CPU check (`latentcode.models.mkl_on_amd`), the
torch version, the device and the dtype. `compute_settings` says them at the start of a session:
config.json holds them for the first session (`compute`), metrics.jsonl a `{"event": "compute"}`
record for every session (a resumed one too), and summary.json the settings of the last session with
the number of forward passes each kernel ran (`kernel_passes`).
"""

from __future__ import annotations

from typing import Any

import torch

from latentcode.allocator import freed_memory_setting
from latentcode.models import fused_gelu, fused_hyper, fused_short
from latentcode.models.mkl_on_amd import mkl_setting

KERNELS = {"fused_short": fused_short.KERNELS, "fused_gelu": fused_gelu.KERNELS, "fused_hyper": fused_hyper.KERNELS}
"""Each compiled kernel by name (`latentcode.models.kernel_ops.Kernel`)."""


def kernel_settings(device: torch.device, dtype: torch.dtype, autocast: bool) -> dict[str, str]:
    """For each kernel: `fused` (its library is built and loaded: training uses it where the layer and
    pass allow, float32 on the CPU) or `formula: WHY` (the torch formula everywhere)."""
    settings = {}
    for name, library in KERNELS.items():
        if not library.enabled:
            why = "turned off (use_fused(False))"
        elif device.type != "cpu" or dtype != torch.float32:
            why = f"the kernel computes float32 on the CPU, this run is {dtype} on {device.type}"
        elif autocast:
            why = "autocast to another dtype"
        else:
            why = library.failure() if library.load() is None else None
        settings[name] = "fused" if why is None else f"formula: {why}"
    return settings


def kernel_passes() -> dict[str, int]:
    """Forward passes through each kernel in this process so far."""
    return {name: library.calls for name, library in KERNELS.items()}


def compute_settings(device: torch.device, dtype: torch.dtype, mixed_precision: str) -> dict[str, Any]:
    """The settings this process trains with now (module docstring)."""
    return {
        "torch_version": torch.__version__,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "mixed_precision": mixed_precision,
        # what the products compute in: autocast's dtype; the parameters and optimizer state are `dtype`
        "autocast_dtype": {"bf16": "bfloat16", "fp16": "float16"}.get(mixed_precision),
        "torch_threads": torch.get_num_threads(),
        "kernels": kernel_settings(device, dtype, mixed_precision != "no"),
        "allocator": freed_memory_setting(),
        "mkl": mkl_setting(),
    }
