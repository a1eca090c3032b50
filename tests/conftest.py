"""One torch thread per test process: on a shared machine a thread per core in every process spins
against the others' (issue 24). Set before torch is imported anywhere, and in the environment, so
that the subprocesses tests start (CLI commands, training launches) inherit it."""

import os

for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")

import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
