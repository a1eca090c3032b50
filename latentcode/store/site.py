"""A site: the (layer, query position, key position) whose latent code a codes file records."""

from __future__ import annotations

import re
from dataclasses import dataclass

from latentcode.store.schema import CodeFileError

_SITE_NAME = re.compile(r"^l(\d+)_q(\d+)_k(\d+)$")


@dataclass(frozen=True, order=True)
class Site:
    """A (layer, query position, key position) choice; positions absolute (0-based) once recorded."""

    layer: int
    query: int
    key: int

    @property
    def name(self) -> str:
        return f"l{self.layer}_q{self.query}_k{self.key}"

    @classmethod
    def from_name(cls, name: str) -> Site:
        match = _SITE_NAME.match(name)
        if not match:
            raise CodeFileError(f"{name!r} is not a site name; expected 'l<layer>_q<query>_k<key>'")
        return cls(*(int(group) for group in match.groups()))

    def __str__(self) -> str:
        return f"(layer {self.layer}, query {self.query}, key {self.key})"
