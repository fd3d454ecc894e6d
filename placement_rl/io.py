"""Reading and writing the user-facing JSON documents (graphs, topologies, plans).

User-facing files are JSON (never pickle). Each document is an object with a ``"format"`` tag and a
``"schema_version"`` integer; the schemas are described in ``docs/formats.md``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from placement_rl.errors import SchemaError


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a JSON file, turning syntax errors into a ``SchemaError`` that names file, line and column."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file: {str(path)!r}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def write_json(path: str | os.PathLike[str], document: Any) -> None:
    """Write ``document`` as indented JSON, atomically (a crash never leaves a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def check_header(document: Any, fmt: str, supported_versions: tuple[int, ...]) -> None:
    """Validate the ``format`` / ``schema_version`` header of a parsed document.

    Raises:
        SchemaError: if ``document`` is not an object, has another format tag, or an unsupported version.
    """
    if not isinstance(document, dict):
        raise SchemaError(f"expected a JSON object with format {fmt!r}, got {type(document).__name__}")
    got = document.get("format")
    if got != fmt:
        raise SchemaError(f"expected a document with format {fmt!r}, got format {got!r}")
    version = document.get("schema_version")
    if version not in supported_versions:
        raise SchemaError(
            f"unsupported {fmt} schema_version {version!r}; this version reads {list(supported_versions)}"
        )


def check_keys(
    obj: dict[str, Any], where: str, required: AbstractSet[str], optional: AbstractSet[str] = frozenset()
) -> None:
    """Reject unknown and missing keys in one JSON object, naming them and the valid keys."""
    if not isinstance(obj, dict):
        raise SchemaError(f"{where}: expected an object, got {type(obj).__name__}")
    unknown = set(obj) - required - set(optional)
    if unknown:
        raise SchemaError(
            f"{where}: unknown key(s) {sorted(unknown)}; valid keys are {sorted(required | set(optional))}"
        )
    missing = required - set(obj)
    if missing:
        raise SchemaError(f"{where}: missing key(s) {sorted(missing)}")


def as_list(value: Any, where: str) -> list[Any]:
    """``value`` if it is a JSON list, else a ``SchemaError`` naming ``where``."""
    if not isinstance(value, list):
        raise SchemaError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def as_str(value: Any, where: str) -> str:
    """``value`` if it is a string, else a ``SchemaError`` naming ``where``."""
    if not isinstance(value, str):
        raise SchemaError(f"{where}: expected a string, got {value!r}")
    return value


def as_int(value: Any, where: str) -> int:
    """``value`` if it is an integer (not a bool), else a ``SchemaError`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"{where}: expected an integer, got {value!r}")
    return value


def as_float(value: Any, where: str) -> float:
    """``value`` as a float if it is a number (not a bool), else a ``SchemaError`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"{where}: expected a number, got {value!r}")
    return float(value)
