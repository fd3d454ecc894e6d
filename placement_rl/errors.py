"""Error types shared by the whole package.

Every user-facing error is a ``ValueError`` subclass whose message names the bad value and what was
expected, so callers (the CLI, Ray workers) can report it without a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class UnknownNameError(ValueError):
    """A model, topology, preset, config key or device name that does not exist.

    Attributes:
        kind: what was being looked up, e.g. ``"model"`` or ``"topology preset"``.
        name: the name that was asked for.
        valid: the names that would have been accepted, sorted.
    """

    def __init__(self, kind: str, name: object, valid: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.valid = sorted(valid)
        super().__init__(f"unknown {kind} {name!r}; expected one of: {', '.join(self.valid)}")


class SchemaError(ValueError):
    """A JSON/YAML document that does not follow the documented schema (see docs/formats.md)."""
