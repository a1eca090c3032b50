"""`Batch.torch()`: a task's numpy batch handed to a model as tensors, without boilerplate; the tasks
themselves stay free of torch."""

import subprocess
import sys

import numpy as np
import torch

from latentcode.tasks import get_task


def test_x_and_y_become_tensors_with_the_same_values_and_labels_stay_numpy():
    batch = get_task("fuzzy_logic").sample(8, split="ood", seed=3)
    tensors = batch.torch()
    assert isinstance(tensors.x, torch.Tensor) and isinstance(tensors.y, torch.Tensor)
    assert tensors.x.dtype == torch.float32 and tuple(tensors.x.shape) == batch.x.shape
    np.testing.assert_array_equal(tensors.x.numpy(), batch.x)
    np.testing.assert_array_equal(tensors.y.numpy(), batch.y)
    assert tensors.labels is batch.labels and (tensors.split, tensors.variant) == (batch.split, batch.variant)
    assert isinstance(batch.x, np.ndarray), "the original batch is left as it was"


def test_sraven_targets_stay_class_indices():
    batch = get_task("sraven").sample(4, split="train", seed=0)
    assert batch.torch().y.dtype == torch.int64 and torch.equal(batch.torch().y, torch.from_numpy(batch.y))


def test_tasks_import_and_sample_without_torch():
    script = ("import sys\nfrom latentcode.tasks import get_task\nget_task('sraven').sample(4, 'ood', seed=0)\n"
              "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
