"""The inputs and outputs of the forward passes that patching compares: a base and a donor batch (a
tensor, or a dict of tensors passed as keyword arguments), and a metric of the model's output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from latentcode.errors import UsageError

# metric(output of the model on a batch) -> one number per example, Tensor [batch]
Metric = Callable[[Any], Tensor]


def check_eval(model: nn.Module) -> None:
    if model.training:
        raise UsageError(f"{type(model).__name__} is in training mode: patching compares forward passes, which "
                         "dropout would make random; call model.eval() first")


def batch_size_of(inputs: Any) -> int:
    tensors = [inputs] if isinstance(inputs, Tensor) else [v for v in inputs.values() if isinstance(v, Tensor)]
    if not tensors:
        raise UsageError(f"inputs must be a tensor or a dict of tensors (keyword arguments of the model), got "
                         f"{type(inputs).__name__}")
    return int(tensors[0].shape[0])


def device_of(model: nn.Module) -> torch.device:
    """Where the model's parameters are (the CPU for a model without any)."""
    parameter = next(model.parameters(), None)
    return torch.device("cpu") if parameter is None else parameter.device


def placement(model: nn.Module) -> dict[str, str]:
    """Where and in what the model ran, for a summary: {"device": "cuda:0", "model_dtype": "bfloat16"}."""
    parameter = next(model.parameters(), None)
    dtype = "float32" if parameter is None else str(parameter.dtype).removeprefix("torch.")
    return {"device": str(device_of(model)), "model_dtype": dtype}


def to_device(inputs: Any, device: torch.device) -> Any:
    """A tensor, or a dict's tensors, on `device` (the model's: the inputs follow the model)."""
    if isinstance(inputs, Tensor):
        return inputs.to(device)
    return {key: value.to(device) if isinstance(value, Tensor) else value for key, value in inputs.items()}


def call_model(model: nn.Module, inputs: Any) -> Any:
    """The model's output on `inputs` (a tensor, or keyword arguments), moved to the model's device first."""
    inputs = to_device(inputs, device_of(model))
    return model(inputs) if isinstance(inputs, Tensor) else model(**inputs)


def to_numpy(tensor: Tensor) -> Any:
    """A tensor as numpy on the CPU, half precisions (which numpy lacks) as float32, float64 kept."""
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor).numpy()


def repeat_batch(inputs: Any, times: int) -> Any:
    """The batch repeated `times` times along dim 0 (copy g is examples g*B .. (g+1)*B-1)."""
    if isinstance(inputs, Tensor):
        return inputs.repeat(times, *([1] * (inputs.ndim - 1)))
    return {key: repeat_batch(value, times) if isinstance(value, Tensor) else value for key, value in inputs.items()}


def check_same_shapes(base: Any, donor: Any) -> None:
    def shape(inputs: Any) -> Any:
        if isinstance(inputs, Tensor):
            return inputs.shape
        return {key: tuple(value.shape) for key, value in inputs.items() if isinstance(value, Tensor)}

    base_shape, donor_shape = shape(base), shape(donor)
    if base_shape != donor_shape:
        raise UsageError(f"base and donor inputs must have the same shape (one donor per base example); got "
                         f"{tuple(base_shape) if isinstance(base_shape, torch.Size) else base_shape} and "
                         f"{tuple(donor_shape) if isinstance(donor_shape, torch.Size) else donor_shape}")


def per_example(values: Any, batch: int, what: str) -> Tensor:
    if not isinstance(values, Tensor) or values.shape != (batch,):
        shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise UsageError(f"the metric must return one number per example, a tensor [{batch}]; it returned {shape}")
    return values



def slice_output(output: Any, start: int, stop: int) -> Any:
    """Examples start..stop of a model's output: a tensor, a tuple/list (first entries sliced) or an
    object with `logits` (Hugging Face outputs)."""
    if isinstance(output, Tensor):
        return output[start:stop]
    if isinstance(output, (tuple, list)):
        return type(output)(slice_output(item, start, stop) if isinstance(item, Tensor) else item for item in output)
    if hasattr(output, "logits"):
        return output.logits[start:stop]
    raise UsageError(f"cannot split the model's output of type {type(output).__name__} into examples; return a tensor")


