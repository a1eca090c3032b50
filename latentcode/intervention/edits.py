"""Edits of latent codes: small dataclasses that map the codes of the edited sites to edited codes.

An edit is called as `edit(codes, sites)` with `codes` `[batch, head, n_sites]` (the latent codes
a[:, q, k] of the sites `sites`, one column per site, all of one layer) and returns edited codes of
the same shape. Every edit takes two keyword arguments:

- `heads`: the heads it changes (None: all); the other heads keep their codes.
- `sites`: the sites it applies to, a selector spec or list as for `Recorder` (None: the sites of
  the `Intervention` it is given to).

The edits:

    SetCode(value)           a[h] = value[h]                    value [H] or one per example [batch, H]
    AddVector(vector)        a[h] = a[h] + vector[h]            steering; [H] or [batch, H]
    ScaleHeads(factor)       a[h] = factor[h] * a[h]            factor a number or [H]
    ZeroAblate()             a[h] = 0
    MeanAblate(means)        a[h] = mean code of the site[h]    from a codes file, optionally per label value
    Interchange(codes)       a[h] = the code of the same site   on a second (source) input: activation patching

Vectors are whole latent codes, one entry per head (width H); `heads` picks which entries are
written. An edit kind is one subclass of `Edit` (its `replacement`, and `for_batch` / `check_call`
where it needs more than the codes); nothing else knows edit kinds by name. Torch tensor values keep
their graph, so an edit can be optimised (`latentcode.intervention.patching`, `.subspace`). An edited
softmax row need not sum to one: that is intended, and nothing renormalizes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from latentcode.errors import LatentcodeError, UsageError
from latentcode.store import CodeFile, Site

SiteSpec = Any  # a selector spec: str, Selector, or a list of Sites / (layer, query, key) tuples

# The public names, exported by latentcode.intervention as they are: a new edit kind is added here.
__all__ = ["AddVector", "Edit", "EditError", "Interchange", "MeanAblate", "ScaleHeads", "SetCode", "ZeroAblate"]


class EditError(LatentcodeError, ValueError):
    """An edit that does not fit the codes it is applied to; names the value and what is expected."""


class CodesOfAnotherModel(LatentcodeError, ValueError):
    """A codes file extracted from another checkpoint than the model being edited (see `checkpoint_sha256_of`)."""


def checkpoint_sha256_of(run_or_model: str | Path | nn.Module) -> str:
    """The SHA-256 `extract` records for this run directory, model directory or model object: of the
    weights file for a directory, of the weights as safetensors bytes for a model object."""
    from latentcode.models.persistence import WEIGHTS_FILE
    from latentcode.provenance import sha256_of_state
    from latentcode.safe_reads import sha256_of_file

    if isinstance(run_or_model, nn.Module):
        return sha256_of_state(run_or_model)
    path = Path(run_or_model)
    for weights in (path / "model" / WEIGHTS_FILE, path / WEIGHTS_FILE):
        if weights.is_file():
            return sha256_of_file(weights)
    raise FileNotFoundError(
        f"{path} is neither a run directory (with model/{WEIGHTS_FILE}) nor a model directory (with {WEIGHTS_FILE})"
    )


def check_codes_file_matches(
    codes_file: CodeFile, model: str | Path | nn.Module | None = None, checkpoint_sha256: str | None = None
) -> None:
    """Raise `CodesOfAnotherModel` unless the file comes from `model` / `checkpoint_sha256` (no check
    when neither is given or the file records no checkpoint)."""
    recorded = str(codes_file.attrs.get("checkpoint_sha256") or "")
    if not recorded or (model is None and checkpoint_sha256 is None):
        return
    expected = checkpoint_sha256 if checkpoint_sha256 is not None else checkpoint_sha256_of(model)
    if recorded != expected:
        raise CodesOfAnotherModel(
            f"{codes_file.path} comes from checkpoint sha256 {recorded}, but the model being edited has sha256 "
            f"{expected}; use codes extracted from this model (latentcode extract RUN_DIR ...)"
        )


def check_finite(values: Any, what: str) -> None:
    """Refuse NaN or infinite edit values: every edited output would be NaN, silently. A tensor that
    requires grad (an edit being optimised) is left alone: checking it would sync every step."""
    if isinstance(values, Tensor):
        if values.requires_grad or bool(torch.isfinite(values).all()):
            return
        bad = values.detach().cpu().numpy()
    else:
        try:
            bad = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            return  # not numbers: the shape checks say what is wrong
        if np.isfinite(bad).all():
            return
    raise EditError(f"{what} holds {int((~np.isfinite(bad)).sum())} NaN or infinite value(s) "
                    f"({np.ravel(bad)[:8].tolist()}); expected finite numbers")


def _as_values(values: Any, what: str) -> Tensor:
    """A vector `[H]` or one per example `[batch, H]` as a tensor. A tensor is kept as it is, graph
    and all, so that a gradient reaches it (an edit can be optimised); anything else becomes float32."""
    if not isinstance(values, Tensor):
        values = torch.as_tensor(np.asarray(values, dtype=np.float32))
    if values.ndim not in (1, 2):
        raise EditError(f"{what} must be a vector [H] or one vector per example [batch, H], got shape "
                        f"{tuple(values.shape)}")
    return values


def _per_example(values: Tensor, codes: Tensor, sites: list[Site], what: str) -> Tensor:
    """`[H]` or `[batch, H]` -> a tensor `[batch or 1, H, 1]` on the codes' device, checked."""
    batch, n_heads = codes.shape[:2]
    layer = sites[0].layer
    if values.shape[-1] != n_heads:
        raise EditError(
            f"{what} has width {values.shape[-1]} but the latent codes at layer {layer} have {n_heads} heads; "
            f"give a vector of {n_heads} values (one per head)"
        )
    if values.ndim == 2 and values.shape[0] != batch:
        raise EditError(
            f"{what} gives {values.shape[0]} vectors (one per example) but this forward pass has {batch} examples; "
            f"give one vector [{n_heads}] for all examples or one per example [{batch}, {n_heads}]"
        )
    return values.to(device=codes.device, dtype=codes.dtype).reshape(-1, n_heads, 1)


@dataclass(frozen=True, eq=False)
class Edit:
    """Base class: `replacement(codes, sites)` gives the new codes; `heads` and `sites` as the module
    docstring says."""

    heads: Sequence[int] | None = field(default=None, kw_only=True)
    sites: SiteSpec | None = field(default=None, kw_only=True)

    def __call__(self, codes: Tensor, sites: list[Site]) -> Tensor:
        """codes `[batch, head, n_sites]` at `sites` -> edited codes, same shape."""
        new = self.replacement(codes, sites)
        if self.heads is None:
            return new.expand_as(codes).to(codes.dtype)
        return torch.where(self.head_mask(codes, sites), new.to(codes.dtype), codes)

    def replacement(self, codes: Tensor, sites: list[Site]) -> Tensor:
        raise NotImplementedError

    def for_batch(self, labels: Mapping[str, np.ndarray]) -> Edit:
        """This edit for one batch whose examples carry `labels` (`{name: [batch, ...]}`, the task's
        labels of the batch): itself, unless the edit needs something of each batch."""
        return self

    def check_call(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Called before each forward pass with the model's arguments: raise `EditError` if this edit
        cannot apply to that call (say why); every call is accepted unless a subclass checks."""

    def head_mask(self, codes: Tensor, sites: list[Site]) -> Tensor:
        """Boolean `[1, head, 1]`: the heads this edit writes."""
        n_heads = codes.shape[1]
        mask = torch.zeros(1, n_heads, 1, dtype=torch.bool, device=codes.device)
        for head in self.heads:
            if not 0 <= int(head) < n_heads:
                raise EditError(
                    f"{type(self).__name__}: head {head} is outside the {n_heads} heads of the latent codes at "
                    f"layer {sites[0].layer} (valid: 0..{n_heads - 1})"
                )
            mask[0, int(head), 0] = True
        return mask

    def carries_gradient(self) -> bool:
        """Whether a value of this edit is a tensor that requires grad (the edit is being optimised or
        differentiated): sources then compute the output from the edited codes everywhere."""
        return any(isinstance(getattr(self, f.name), Tensor) and getattr(self, f.name).requires_grad
                   for f in dataclasses.fields(self))

    def describe(self) -> str:
        """A short name for tables: the operation and its heads."""
        heads = "all heads" if self.heads is None else "heads " + ",".join(map(str, self.heads))
        return f"{type(self).__name__} ({heads})"


@dataclass(frozen=True, eq=False)
class SetCode(Edit):
    """Set the code to `value`: one vector `[H]` for all examples, or one per example `[batch, H]`."""

    value: Any

    def replacement(self, codes: Tensor, sites: list[Site]) -> Tensor:
        check_finite(self.value, "SetCode value")
        return _per_example(_as_values(self.value, "SetCode value"), codes, sites, "SetCode value")


@dataclass(frozen=True, eq=False)
class AddVector(Edit):
    """Add `vector` to the code (steering): `[H]` for all examples, or `[batch, H]`."""

    vector: Any

    def replacement(self, codes: Tensor, sites: list[Site]) -> Tensor:
        check_finite(self.vector, "AddVector vector")
        return codes + _per_example(_as_values(self.vector, "AddVector vector"), codes, sites, "AddVector vector")


@dataclass(frozen=True, eq=False)
class ScaleHeads(Edit):
    """Multiply the code by `factor`: a number, or one factor per head `[H]`."""

    factor: Any

    def replacement(self, codes: Tensor, sites: list[Site]) -> Tensor:
        check_finite(self.factor, "ScaleHeads factor")
        if not isinstance(self.factor, Tensor) and np.ndim(self.factor) == 0:
            return codes * float(self.factor)
        if isinstance(self.factor, Tensor) and self.factor.ndim == 0:
            return codes * self.factor.to(device=codes.device, dtype=codes.dtype)
        factor = _as_values(self.factor, "ScaleHeads factor")
        if factor.ndim != 1:
            raise EditError(f"ScaleHeads factor must be a number or one factor per head [H], got shape {factor.shape}")
        return codes * _per_example(factor, codes, sites, "ScaleHeads factor")


@dataclass(frozen=True, eq=False)
class ZeroAblate(Edit):
    """Set the code to zero."""

    def replacement(self, codes: Tensor, sites: list[Site]) -> Tensor:
        return torch.zeros_like(codes)


def _codes_at(values: Mapping[Site, np.ndarray], sites: list[Site], what: str) -> np.ndarray:
    """`{site: [..., H]}` -> `[..., H, n_sites]` for `sites`; a missing site is an error."""
    missing = [site for site in sites if site not in values]
    if missing:
        have = ", ".join(site.name for site in sorted(values)[:12]) + (" ..." if len(values) > 12 else "")
        raise EditError(f"{what} has no code at site {missing[0]}; it has codes at {have}")
    if any(isinstance(values[site], Tensor) for site in sites):
        return torch.stack([torch.as_tensor(values[site]) for site in sites], dim=-1)
    return np.stack([values[site] for site in sites], axis=-1)


@dataclass(frozen=True, eq=False)
class MeanAblate(Edit):
    """Set the code to the mean code of its site.

    means: `{Site: [H]}`, or with `label_values` `{Site: [n_values, H]}`: one mean per label value.
    label_values: the label value of each row of the means (per-label means), else None.
    labels: `[batch]`, the label of each example of the next forward passes (per-label means only;
        `with_labels` gives a copy for another batch).
    Build it from a codes file with `MeanAblate.from_codes`.
    """

    means: Mapping[Site, np.ndarray]
    label_values: np.ndarray | None = field(default=None, kw_only=True)
    labels: np.ndarray | None = field(default=None, kw_only=True)
    label: str | None = field(default=None, kw_only=True)  # the label's name, for messages

    @classmethod
    def from_codes(
        cls,
        path: str | Path,
        heads: Sequence[int] | None = None,
        *,
        by: str | None = None,
        split: str | None = None,
        model: str | Path | nn.Module | None = None,
        checkpoint_sha256: str | None = None,
        sites: SiteSpec | None = None,
    ) -> MeanAblate:
        """Mean codes of every site of the codes file at `path` (of `split`; all examples if None),
        per value of the label `by` if given.

        model / checkpoint_sha256: the model that will be edited (a run or model directory, or a model
        object: what the file was extracted from), or its checkpoint's SHA-256; when given, the file must
        come from that checkpoint (else `CodesOfAnotherModel`)."""
        codes_file = path if isinstance(path, CodeFile) else CodeFile(path)  # a file, or codes in memory
        check_codes_file_matches(codes_file, model=model, checkpoint_sha256=checkpoint_sha256)
        if codes_file.attrs.get("score", "pattern") != "pattern":
            raise EditError(
                f"{codes_file.path} holds raw scores (score={codes_file.attrs.get('score')!r}); mean-ablation "
                "replaces latent codes, so it needs a file extracted with score='pattern'"
            )
        def finite_codes(site: Site) -> np.ndarray:
            # A NaN row (or no row) would make the mean NaN and every edited output NaN, silently.
            codes = codes_file.codes(site, split)
            of_split = "" if split is None else f" of split {split!r}"
            if len(codes) == 0:
                raise EditError(f"{codes_file.path} has no examples{of_split}; a mean code needs at least one")
            bad_rows = int((~np.isfinite(codes)).any(axis=1).sum())
            if bad_rows:
                raise EditError(
                    f"{codes_file.path}: site {site} has {bad_rows} of {len(codes)} rows{of_split} with NaN or "
                    "infinite codes; their mean would be NaN; re-extract the file (or choose a split without them)"
                )
            return codes

        if by is None:
            means = {site: finite_codes(site).mean(axis=0) for site in codes_file.sites}
            return cls(means, heads=heads, sites=sites)
        labels = codes_file.labels(by, split)
        if labels.ndim != 1:
            raise EditError(
                f"per-label means need a label with one value per example; {by!r} in {codes_file.path} has shape "
                f"{labels.shape[1:]} per example (use a label such as 'rule', or name one entry of it)"
            )
        values = np.unique(labels)
        means = {}
        for site in codes_file.sites:
            codes = finite_codes(site)
            means[site] = np.stack([codes[labels == value].mean(axis=0) for value in values])
        return cls(means, heads=heads, sites=sites, label_values=values, label=by)

    def with_labels(self, labels: Any) -> MeanAblate:
        """This edit for a batch whose examples have `labels` `[batch]` (per-label means)."""
        return dataclasses.replace(self, labels=np.asarray(labels))

    def for_batch(self, labels: Mapping[str, np.ndarray]) -> MeanAblate:
        """With per-label means: this edit with the batch's values of its label (`with_labels`)."""
        if self.label_values is None:
            return self
        if self.label not in labels:
            raise UsageError(
                f"MeanAblate has one mean per value of {self.label!r}, which the task's batches do not carry; "
                f"their labels are {sorted(labels)}"
            )
        return self.with_labels(labels[self.label])

    def replacement(self, codes: Tensor, sites: list[Site]) -> Tensor:
        means = _codes_at(self.means, sites, "MeanAblate")  # [H, n] or [n_values, H, n]
        check_finite(means, "MeanAblate means")
        if self.label_values is None:
            values = means[None]
        else:
            if self.labels is None:
                raise EditError(
                    f"MeanAblate has one mean per value of {self.label or 'a label'} but no labels for this batch; "
                    "call edit.with_labels(labels_of_the_batch) before the forward pass"
                )
            labels = self.labels.reshape(-1)
            if len(labels) != codes.shape[0]:
                raise EditError(
                    f"MeanAblate was given labels for {len(labels)} examples but this forward pass has "
                    f"{codes.shape[0]} examples; give one label per example"
                )
            rows = np.searchsorted(self.label_values, labels)  # sorted and unique: np.unique's
            known = np.isin(labels, self.label_values)
            if not known.all():
                unknown = labels[~known][0].item()
                raise EditError(
                    f"MeanAblate has no mean for {self.label or 'label'} value {unknown!r}: the codes file holds "
                    f"the values {self.label_values.tolist()}"
                )
            values = means[rows]
        if values.shape[1] != codes.shape[1]:
            raise EditError(
                f"MeanAblate means have width {values.shape[1]} but the latent codes at layer {sites[0].layer} have "
                f"{codes.shape[1]} heads; use a codes file of this model"
            )
        return torch.as_tensor(values, device=codes.device, dtype=codes.dtype)

    def describe(self) -> str:
        return super().describe() + (f" by {self.label}" if self.label_values is not None else "")


@dataclass(frozen=True, eq=False)
class Interchange(Edit):
    """Set the code to that of the same site on a second (source) input: activation patching.

    codes: `{Site: [batch, H]}`, the source input's codes (as `Recorder.pop()` returns them).
    source_shape: the shape of the source input's first tensor; when known, the intervention checks
        that each forward pass gets an input of this shape.
    Build it with `Interchange.from_inputs(model, source_inputs, sites=...)`.
    """

    codes: Mapping[Site, np.ndarray]
    source_shape: tuple[int, ...] | None = field(default=None, kw_only=True)

    @classmethod
    def from_inputs(
        cls,
        model: nn.Module,
        *inputs: Any,
        sites: SiteSpec = "last-self",
        heads: Sequence[int] | None = None,
        source: Any = None,
        task_config: dict | None = None,
        **kwargs: Any,
    ) -> Interchange:
        """Run `model(*inputs, **kwargs)` once (no gradients) under a Recorder at `sites` and keep its
        codes; the edit then applies at those sites."""
        from latentcode.extraction.recorder import Recorder

        with Recorder(model, sites, source=source, task_config=task_config) as recorder, torch.no_grad():
            model(*inputs, **kwargs)
        return cls(recorder.pop(), heads=heads, sites=sites, source_shape=first_tensor_shape(inputs, kwargs))

    def check_call(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """The model must be called with an input of the source input's shape (where known)."""
        if self.source_shape is None:
            return
        shape = first_tensor_shape(args, kwargs)
        if shape is not None and tuple(shape) != tuple(self.source_shape):
            raise EditError(
                f"Interchange: the source input has shape {list(self.source_shape)} but the model was called "
                f"with shape {list(shape)}; activation patching needs a source batch of the same shape"
            )

    def replacement(self, codes: Tensor, sites: list[Site]) -> Tensor:
        values = _codes_at(self.codes, sites, "Interchange")  # [source batch, H, n]
        if values.shape[0] != codes.shape[0] or values.shape[1] != codes.shape[1]:
            raise EditError(
                f"Interchange: the source input gave codes for {values.shape[0]} examples x {values.shape[1]} heads "
                f"but this forward pass has {codes.shape[0]} examples x {codes.shape[1]} heads at layer "
                f"{sites[0].layer}; give a source batch of the same shape"
            )
        return torch.as_tensor(values).to(device=codes.device, dtype=codes.dtype)


def first_tensor_shape(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The shape of the first tensor among a call's arguments (None if there is none)."""
    for value in [*args, *kwargs.values()]:
        if isinstance(value, Tensor):
            return tuple(value.shape)
    return None
