"""A learned intervention: interchange only a low-rank subspace of the code space, trained so that
the interchange carries the donor's sub-task (in the spirit of distributed alignment search, Geiger
et al. 2023, applied to the H-dimensional latent codes instead of the residual stream).

At every selected site the code a (width H, one entry per head) becomes

    a' = a + Q Qᵀ (a_donor - a)          Q: [H, k] with orthonormal columns

so the k directions spanned by Q take the donor's values and the H - k others keep the base's. One
subspace is shared by all selected sites. k = H is plain activation patching (`Interchange`).

    basis, history = learn_subspace(model, base_x, donor_x, targets, loss, sites="2:*:3|7|11", rank=2)
    with Intervention(model, SubspaceInterchange.from_inputs(model, donor_x, basis, sites=...), sites=...):
        output = model(base_x)

`learn_subspace` optimises only Q (Adam on an unconstrained [H, k] matrix, orthonormalised by QR in
every forward pass); the model's parameters are frozen for the duration and restored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from latentcode.errors import UsageError
from latentcode.intervention.edits import Edit, EditError, Interchange, _codes_at
from latentcode.intervention.patching.sweep import frozen
from latentcode.store import Site


def orthonormal(basis: Tensor) -> Tensor:
    """`[H, k]` -> `[H, k]` with orthonormal columns spanning the same subspace (QR)."""
    q, r = torch.linalg.qr(basis)
    return q * torch.sign(torch.diagonal(r)).where(torch.diagonal(r) != 0, torch.ones_like(torch.diagonal(r)))


@dataclass(frozen=True, eq=False)
class SubspaceInterchange(Edit):
    """Interchange the part of each code in the span of `basis` `[H, k]` with the donor's
    (`codes`: `{Site: [batch, H]}`, as `Interchange` holds them)."""

    codes: Any
    basis: Tensor

    @classmethod
    def from_inputs(cls, model: nn.Module, donor_inputs: Any, basis: Tensor, sites: Any,
                    **kwargs: Any) -> SubspaceInterchange:
        """The donor's codes at `sites` from one forward pass without gradients."""
        donor = Interchange.from_inputs(model, donor_inputs, sites=sites, **kwargs)
        return cls(donor.codes, basis, sites=sites)

    def replacement(self, codes: Tensor, sites: list[Site]) -> Tensor:
        donor = torch.as_tensor(_codes_at(self.codes, sites, "SubspaceInterchange")).to(codes.device, codes.dtype)
        if donor.shape != codes.shape:
            raise EditError(f"SubspaceInterchange: the donor gave codes of shape {tuple(donor.shape)} but this forward "
                            f"pass has {tuple(codes.shape)} [batch, head, sites]; give a donor batch of the same shape")
        if self.basis.ndim != 2 or self.basis.shape[0] != codes.shape[1]:
            raise EditError(f"SubspaceInterchange basis has shape {tuple(self.basis.shape)}; expected "
                            f"[{codes.shape[1]}, k] (one row per head of layer {sites[0].layer})")
        q = orthonormal(self.basis.to(codes.device, codes.dtype))
        return codes + torch.einsum("hk,gk,bgn->bhn", q, q, donor - codes)


@dataclass
class SubspaceFit:
    """`basis` `[H, k]` (orthonormal columns) and the training loss per step (`losses`)."""

    basis: Tensor
    losses: list[float]


def learn_subspace(
    model: nn.Module,
    base_inputs: Tensor,
    donor_inputs: Tensor,
    targets: Tensor,
    loss: Callable[[Any, Tensor], Tensor],
    sites: Any,
    rank: int,
    *,
    steps: int = 200,
    batch_size: int = 64,
    learning_rate: float = 0.01,
    seed: int = 0,
    task_config: dict | None = None,
) -> SubspaceFit:
    """Learn a rank-`rank` subspace of the code space at `sites` such that interchanging it from
    `donor_inputs` into `base_inputs` makes `loss(model output, targets)` small (e.g. cross-entropy
    towards the answer of the donor's sub-task on the base). Minibatches of `batch_size` pairs drawn
    with `seed`; returns the basis and the loss per step."""
    from latentcode.intervention.intervener import Intervention

    n = len(base_inputs)
    if len(donor_inputs) != n or len(targets) != n:
        raise UsageError(f"base_inputs, donor_inputs and targets must have one row per pair; got {n}, "
                         f"{len(donor_inputs)} and {len(targets)} rows")
    if model.training:
        raise UsageError(f"{type(model).__name__} is in training mode; call model.eval() first")
    generator = torch.Generator().manual_seed(seed)
    codes = Interchange.from_inputs(model, donor_inputs[:1], sites=sites, task_config=task_config).codes
    if not codes:
        raise UsageError(f"no latent code at sites {sites!r}")
    n_heads = int(np.asarray(next(iter(codes.values()))).shape[-1])
    if not isinstance(rank, int) or not 1 <= rank <= n_heads:
        raise UsageError(f"rank={rank!r}: expected an integer from 1 to the {n_heads} heads of the code space")
    basis = nn.Parameter(torch.randn(n_heads, rank, generator=generator, dtype=torch.float32))
    optimizer = torch.optim.Adam([basis], lr=learning_rate)
    losses = []
    with frozen(model):
        for _ in range(steps):
            rows = torch.randint(n, (min(batch_size, n),), generator=generator)
            edit = SubspaceInterchange.from_inputs(model, donor_inputs[rows], basis, sites, task_config=task_config)
            with Intervention(model, edit, sites=sites, task_config=task_config):
                value = loss(model(base_inputs[rows]), targets[rows])
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
            losses.append(float(value.detach()))
    return SubspaceFit(orthonormal(basis.detach()), losses)


def patched_outputs(model: nn.Module, base_inputs: Tensor, donor_inputs: Tensor, sites: Any,
                    basis: Tensor | None = None, batch_size: int = 256, task_config: dict | None = None) -> Tensor:
    """The model's outputs on `base_inputs` with the subspace `basis` (None: every direction, plain
    interchange) of the codes at `sites` taken from `donor_inputs`, in batches, without gradients."""
    from latentcode.intervention.intervener import Intervention

    outputs = []
    for start in range(0, len(base_inputs), batch_size):
        base, donor = base_inputs[start:start + batch_size], donor_inputs[start:start + batch_size]
        with torch.no_grad():
            if basis is None:
                edit: Edit = Interchange.from_inputs(model, donor, sites=sites, task_config=task_config)
            else:
                edit = SubspaceInterchange.from_inputs(model, donor, basis, sites, task_config=task_config)
            with Intervention(model, edit, sites=sites, task_config=task_config):
                outputs.append(model(base))
    return torch.cat(outputs)


def random_basis(n_heads: int, rank: int, seed: int = 0) -> Tensor:
    """A uniformly random rank-`rank` subspace `[H, k]`: the control for a learned one."""
    return orthonormal(torch.randn(n_heads, rank, generator=torch.Generator().manual_seed(seed)))


__all__: Sequence[str] = ["SubspaceFit", "SubspaceInterchange", "learn_subspace", "orthonormal", "patched_outputs",
                          "random_basis"]
