"""The learned subspace interchange (issue 22, item 4): rank H is plain interchange, patching a base
into itself changes nothing, and training finds a planted subspace: with a loss that is small only
when head 0 takes the donor's code and the other heads keep the base's, the learned rank-1 basis
is head 0's axis."""

import pytest
import torch

from latentcode import ModelConfig, build_model
from latentcode.errors import UsageError
from latentcode.intervention import Interchange
from latentcode.intervention.subspace import (
    SubspaceInterchange,
    learn_subspace,
    orthonormal,
    patched_outputs,
    random_basis,
)

CONFIG = dict(n_layers=2, d_model=8, n_heads=3, kqv_dim=9, d_mlp=8, n_ctx=5, d_in=3, d_out=4)


def tiny():
    return build_model(ModelConfig(attention="hyla", **CONFIG), seed=0).eval().double()


def inputs(seed, batch=4):
    return torch.randn(batch, 5, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_full_rank_is_plain_interchange_and_the_base_direction_is_kept():
    model, base, donor = tiny(), inputs(1), inputs(2)
    sites = "1:-1:*"
    full = patched_outputs(model, base, donor, sites, basis=torch.eye(3, dtype=torch.float64))
    plain = patched_outputs(model, base, donor, sites, basis=None)
    torch.testing.assert_close(full, plain)
    # a subspace orthogonal to the donor-minus-base differences changes nothing: patch the base into itself
    same = patched_outputs(model, base, base, sites, basis=random_basis(3, 2).double())
    with torch.no_grad():
        torch.testing.assert_close(same, model(base))


def test_orthonormal_spans_the_same_columns():
    basis = torch.randn(5, 2, generator=torch.Generator().manual_seed(0))
    q = orthonormal(basis)
    torch.testing.assert_close(q.T @ q, torch.eye(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(q @ q.T @ basis, basis, atol=1e-5, rtol=0)


def test_learning_recovers_the_direction_the_output_reads():
    """Plant the answer: a loss that is small only when the code moves along u (the first head), so
    the learned rank-1 basis must be +-e_0."""
    model, base, donor = tiny(), inputs(1, batch=32), inputs(2, batch=32)
    sites = "1:-1:-1"
    donor_code = torch.as_tensor(Interchange.from_inputs(model, donor, sites=sites).codes[next(iter(
        Interchange.from_inputs(model, donor, sites=sites).codes))], dtype=torch.float64)
    seen = {}

    class Spy(SubspaceInterchange):
        def replacement(self, codes, sites_):
            new = super().replacement(codes, sites_)
            seen["edited"] = new
            return new

    # the loss: squared distance of the edited code to (donor head 0, base heads 1-2)
    def loss(output, target):
        edited = seen["edited"][:, :, 0]
        return ((edited - target) ** 2).sum(1).mean()

    with torch.no_grad():
        base_code = torch.as_tensor(Interchange.from_inputs(model, base, sites=sites).codes[next(iter(
            Interchange.from_inputs(model, base, sites=sites).codes))], dtype=torch.float64)
    target = base_code.clone()
    target[:, 0] = donor_code[:, 0]
    import latentcode.intervention.subspace as subspace

    original = subspace.SubspaceInterchange
    subspace.SubspaceInterchange = Spy
    try:
        fit = learn_subspace(model, base, donor, target, loss, sites, rank=1, steps=150, batch_size=32, learning_rate=0.05)
    finally:
        subspace.SubspaceInterchange = original
    assert abs(float(fit.basis[0, 0])) == pytest.approx(1.0, abs=1e-2)
    assert fit.losses[-1] < 0.1 * fit.losses[0]


def test_bad_rank_is_refused():
    model, base, donor = tiny(), inputs(1), inputs(2)
    with pytest.raises(UsageError, match="rank=4"):
        learn_subspace(model, base, donor, torch.zeros(4), lambda o, t: o.sum(), "1:-1:-1", rank=4)
