"""The environment variables that switch a compute setting, each with the few values it takes.

A value outside its list is refused in one line (`SwitchError`, a user error), never taken as the
default: `LATENTCODE_MKL_ON_AMD=yes` or `LATENTCODE_KERNELS=off` would otherwise run something the
user did not ask for, silently. Unset or empty is the default. `check_switches()` reads them all (the
command line calls it before any command runs); each user reads its own with `switch(name)`.

- `LATENTCODE_MKL_ON_AMD`: `1` answers MKL's CPU check on AMD CPUs for the training of this process
  (`latentcode.models.mkl_on_amd`, the same as `latentcode train --mkl-on-amd`); `0` or unset leaves
  libtorch as it is.
- `LATENTCODE_MKL_CPU_CHECK`: the old switch, from when the check was answered by default; `keep`
  (what every process now does unless opted in) is accepted, any other value refused with a pointer
  to the opt-in.
- `LATENTCODE_KERNELS`: `fused` (the default) lets training use the compiled kernels where they apply;
  `formula` runs the torch formula everywhere and compiles or loads nothing.
"""

from __future__ import annotations

import os

from latentcode.errors import UsageError

SWITCHES: dict[str, tuple[str, ...]] = {
    "LATENTCODE_MKL_ON_AMD": ("0", "1"),
    "LATENTCODE_MKL_CPU_CHECK": ("keep",),
    "LATENTCODE_KERNELS": ("fused", "formula"),
}
_HINTS = {
    "LATENTCODE_MKL_CPU_CHECK": "; MKL's own check is kept unless asked: to answer it on AMD CPUs set "
                                "LATENTCODE_MKL_ON_AMD=1 or pass latentcode train --mkl-on-amd",
}


class SwitchError(UsageError):
    """An environment switch set to a value it does not take."""


def switch(name: str) -> str | None:
    """The value of the switch `name` (lower case, stripped), or None where it is unset or empty;
    a value outside `SWITCHES[name]` raises SwitchError."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    value = raw.strip().lower()
    if value not in SWITCHES[name]:
        expected = " or ".join(SWITCHES[name])
        raise SwitchError(f"{name}={raw!r} is not a value it takes; expected {expected} (or "
                          f"unset){_HINTS.get(name, '')}")
    return value


def check_switches() -> None:
    """Refuse, in one line, the first switch set to a value it does not take."""
    for name in SWITCHES:
        switch(name)
