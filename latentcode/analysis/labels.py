"""Choosing what to decode or colour by: labels of a codes file, one column of them, their names.

A *label spec* is the name of a per-example array of the file (a task label such as ``rule``,
``query_rule`` or ``term_present``; or ``prediction`` / ``target`` / an extra array, when no label
has that name), optionally followed by an index into its trailing dimensions:
``query_rule[-1]`` is the rule of the last query position (``[N, M] -> [N]``),
``negation_bits[0,2]`` one negation bit (``[N, K, L] -> [N]``), ``negation_bits[1]`` one term's
bits (``[N, K, L] -> [N, L]``). Negative indices count from the end, as in numpy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from latentcode.store import CodeFile, CodeFileError

__all__ = ["available_labels", "display_value", "is_categorical", "label_spec_name", "parse_label_spec", "select_label",
           "value_names"]

_SPEC = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(?:\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\])?\s*$")
# At most this many distinct integer values make a label categorical (legend, not colour bar).
MAX_CATEGORIES = 20


class LabelSpecError(CodeFileError):
    """A label spec that cannot be read or does not fit the label's shape."""


def parse_label_spec(spec: str) -> tuple[str, tuple[int, ...]]:
    """``"query_rule[-1]"`` -> ``("query_rule", (-1,))``; ``"rule"`` -> ``("rule", ())``."""
    match = _SPEC.match(str(spec))
    if not match:
        raise LabelSpecError(
            f"{spec!r} is not a label spec; expected a label name, optionally with an index into its "
            "columns, e.g. 'rule', 'query_rule[-1]' or 'negation_bits[0,2]'"
        )
    name, index = match.groups()
    return name, tuple(int(part) for part in index.split(",")) if index else ()


def label_spec_name(name: str, index: Sequence[int]) -> str:
    """The inverse of `parse_label_spec`: ``("term_present", (5,))`` -> ``"term_present[5]"``."""
    return f"{name}[{','.join(str(int(i)) for i in index)}]" if len(index) else name


def available_labels(code_file: CodeFile) -> list[str]:
    """Every name `select_label` accepts for this file, labels first."""
    present = [name for name, has in (("prediction", code_file.has_prediction), ("target", code_file.has_target))
               if has]
    return list(dict.fromkeys([*code_file.label_names, *present, *code_file.extra_names]))


def _read(code_file: CodeFile, name: str, split) -> np.ndarray:
    if name in code_file.label_names:
        return code_file.labels(name, split)
    if name == "prediction" and code_file.has_prediction:
        return code_file.prediction(split)
    if name == "target" and code_file.has_target:
        return code_file.target(split)
    if name in code_file.extra_names:
        return code_file.extra(name, split)
    raise CodeFileError(
        f"{code_file.path} has no label {name!r}; the labels it has are {available_labels(code_file)}"
    )


def select_label(code_file: CodeFile | str, spec: str, split: str | None = None) -> tuple[np.ndarray, str]:
    """The values of a label spec on one split (None: every example).

    Returns:
        ``(values, name)``: ``values`` is ``[N]`` or ``[N, ...]`` (the label's trailing dimensions
        left after the index), ``name`` the spec without spaces, e.g. ``"query_rule[-1]"``.
    """
    code_file = code_file if isinstance(code_file, CodeFile) else CodeFile(code_file)
    name, index = parse_label_spec(spec)
    values = _read(code_file, name, split)
    trailing = values.shape[1:]
    if len(index) > len(trailing):
        what = "one value per example" if not trailing else f"shape [N, {', '.join(map(str, trailing))}]"
        raise LabelSpecError(
            f"label {name!r} has {what}; {spec!r} gives {len(index)} indices but it takes at most "
            f"{len(trailing)}"
        )
    for axis, (position, size) in enumerate(zip(index, trailing[: len(index)], strict=True), start=1):
        if not -size <= position < size:
            raise LabelSpecError(
                f"label {name!r} has shape [N, {', '.join(map(str, trailing))}]: index {position} in "
                f"{spec!r} is out of range for axis {axis} (size {size})"
            )
    return values[(slice(None), *index)], label_spec_name(name, index)


def is_categorical(values: np.ndarray, max_categories: int = MAX_CATEGORIES) -> bool:
    """Whether a one-column label is best shown as categories: integer (or bool, or
    integer-valued float) values with at most `max_categories` distinct values."""
    values = np.asarray(values)
    if values.ndim != 1 or values.dtype.kind not in "biuf":
        return False
    if values.dtype.kind == "f" and not (np.isfinite(values).all() and np.all(values == np.round(values))):
        return False
    return len(np.unique(values)) <= max_categories


def value_names(code_file: CodeFile, spec: str) -> list[str] | None:
    """Display names of the integer values of a label (or of the columns of a multi-column label
    given without an index), as the codes file records them; None where it records none.

    E.g. the SRAVEN ``rule`` values are rule names; the columns of an unindexed fuzzy-logic
    ``term_present`` are terms such as ``x0∧¬x1∧x2∧x3``.
    """
    name, index = parse_label_spec(spec)
    if name in code_file.value_names:
        return list(code_file.value_names[name])
    if name in code_file.column_names and not index:
        return list(code_file.column_names[name])
    return None


def display_value(value, names: Sequence[str] | None) -> str:
    """``names[value]`` where it exists, else the value itself as text."""
    if names is not None and float(value).is_integer() and 0 <= int(value) < len(names):
        return names[int(value)]
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
