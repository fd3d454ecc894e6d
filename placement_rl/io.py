"""Reading and writing the user-facing JSON documents (graphs, topologies, plans).

User-facing files are JSON (never pickle). Each document is an object with a ``"format"`` tag and a
``"schema_version"`` integer; the schemas are described in ``docs/formats.md``.

Strict JSON both ways: ``NaN`` and ``Infinity`` (which Python's ``json`` accepts and writes by
default) are refused when reading and never written (:func:`finite_or_none` turns a figure that has
no finite value, such as the best cost of a search before any plan fits, into ``null``); numbers too
large for a float, documents nested too deeply and files that are not UTF-8 are each a clean
:class:`SchemaError` naming the file.

The core reads no YAML: experiment and training files are read at the edge
(:mod:`placement_rl.rl.yaml_files`).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from placement_rl.errors import SchemaError


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; expected a finite number")


def loads_json(text: str, where: str) -> Any:
    """Parse strict JSON text; errors are :class:`SchemaError` naming ``where``, line and column."""
    try:
        return json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{where}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except ValueError as exc:  # NaN / Infinity, or an integer too long to convert
        raise SchemaError(f"{where}: {exc}") from None
    except RecursionError:
        raise SchemaError(f"{where}: JSON nested too deeply") from None


def read_user_text(path: str | os.PathLike[str], kind: str) -> str:
    """The UTF-8 text of a user's ``kind`` file (``"JSON"``, ``"YAML"``): a missing file is a
    ``FileNotFoundError`` naming it, a folder or a file that is not UTF-8 a ``SchemaError``."""
    path = Path(path)
    if path.is_dir():
        raise SchemaError(f"{str(path)!r} is a folder; expected a {kind} file")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file: {str(path)!r}") from None
    except UnicodeDecodeError as exc:
        raise SchemaError(f"{path}: not UTF-8 text (byte {exc.start}); expected a {kind} file") from None


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a JSON file, turning every defect into a ``SchemaError`` that names the file (and the line
    and column of a syntax error); a missing file is a ``FileNotFoundError`` naming it."""
    return loads_json(read_user_text(path, "JSON"), str(path))


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float (``NaN``, ``inf``) inside lists, tuples and dicts replaced
    by ``None`` (JSON ``null``), tuples as lists: for figures that legitimately have no finite value."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def dumps_json(document: Any, indent: int | None = 1) -> str:
    """``document`` as strict JSON text.

    Raises:
        ValueError: when it holds a non-finite number (a bug upstream: every figure should be finite).
    """
    try:
        return json.dumps(document, indent=indent, allow_nan=False)
    except ValueError as exc:
        raise ValueError(f"refusing to write non-standard JSON ({exc}): a figure is NaN or infinite") from None


def _umask() -> int:
    """The process's file-creation mask (read by setting it and putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike[str], document: Any) -> None:
    """Write ``document`` as indented strict JSON, atomically: a crash never leaves a half-written file,
    and a file that cannot be written is an error before anything is replaced."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a folder; expected a file path to write")
    if path.exists() and not path.is_file():  # a device, pipe or socket: never replaced by a file
        raise ValueError(f"{str(path)!r} is not a regular file; expected a file path to write")
    text = dumps_json(document) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide outputs from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    if isinstance(version, bool) or version not in supported_versions:
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
    """``value`` as a finite float if it is a number (not a bool), else a ``SchemaError`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"{where}: expected a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise SchemaError(f"{where}: {value} is out of the range of a float") from None
    if not math.isfinite(number):
        raise SchemaError(f"{where}: expected a finite number, got {value!r}")
    return number
