"""Configuration records: a mapping (YAML, JSON, an RLlib ``env_config``) -> a validated frozen dataclass.

Every configuration of the project (environments, rewards, instance generators, training runs,
sweeps) is a frozen dataclass whose fields carry their checks (:func:`option` with a :class:`Rule`),
read by one function, :func:`parse`:

* a key that is not a field is an error listing the valid keys;
* each field's rule runs on its value; an error names the field, the value and what was expected
  (numbers must be finite: ``NaN`` and ``inf`` are refused wherever a number is expected);
* an optional ``validate(where)`` method of the dataclass checks rules that tie fields together.

Errors are :class:`~placement_rl.errors.SchemaError` (a ``ValueError``)::

    PlacementConfig: unknown key(s) ['maxgroups']; expected some of ['action_space', ...]
    config.ppo: lr = -1; expected a number > 0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from placement_rl.errors import SchemaError

T = TypeVar("T")


@dataclass(frozen=True)
class Rule:
    """The check of one option: ``test(value)`` is true for good values; ``expected`` says what they are."""

    test: Callable[[Any], bool]
    expected: str

    def check(self, value: Any, where: str, name: str) -> None:
        """Raise :class:`SchemaError` naming ``where``, ``name`` and the value unless it passes."""
        if not self.test(value):
            raise SchemaError(f"{where}: {name} = {value!r}; expected {self.expected}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bounds(low: float | None, high: float | None, low_open: bool) -> tuple[Callable[[float], bool], str]:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"<= {high:g}")

    def inside(v: float) -> bool:
        if low is not None and (v <= low if low_open else v < low):
            return False
        return high is None or v <= high

    return inside, " and ".join(parts)


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False, null: bool = False) -> Rule:
    """A finite number (int or float, not bool) in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    inside, bounds = _bounds(low, high, low_open)
    what = "a finite number" + (f" {bounds}" if bounds else "") + (" or null" if null else "")
    return Rule(lambda v: (null and v is None) or (_is_number(v) and inside(float(v))), what)


def integer(low: int | None = None, high: int | None = None, *, null: bool = False) -> Rule:
    """An integer (not bool) in ``[low, high]``."""
    inside, bounds = _bounds(low, high, False)
    what = "an integer" + (f" {bounds}" if bounds else "") + (" or null" if null else "")
    return Rule(lambda v: (null and v is None) or (isinstance(v, int) and not isinstance(v, bool) and inside(v)), what)


def choice(values: Iterable[Any], *, null: bool = False) -> Rule:
    """One of ``values``."""
    allowed = tuple(values)
    what = f"one of {list(allowed)}" + (" or null" if null else "")
    return Rule(lambda v: (null and v is None) or (isinstance(v, type(allowed[0])) and v in allowed), what)


def text(*, empty: bool = False) -> Rule:
    """A string (non-empty unless ``empty``)."""
    return Rule(lambda v: isinstance(v, str) and (empty or bool(v)), "a string" if empty else "a non-empty string")


def sequence_of(rule: Rule | None = None, *, empty: bool = True) -> Rule:
    """A list or tuple (not a string) whose every item passes ``rule`` (non-empty unless ``empty``)."""
    what = ("a list" if empty else "a non-empty list") + (f" whose every item is {rule.expected}" if rule else "")

    def test(v: Any) -> bool:
        if not isinstance(v, (list, tuple)) or not (empty or v):
            return False
        return rule is None or all(rule.test(item) for item in v)

    return Rule(test, what)


def option(
    default: Any = dataclasses.MISSING, *, rule: Rule | None = None, default_factory: Any = dataclasses.MISSING
) -> Any:
    """A dataclass field whose value :func:`parse` checks with ``rule``."""
    metadata = {"rule": rule} if rule is not None else {}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_known(keys: Iterable[str], valid: Collection[str], where: str, what: str = "key") -> None:
    """Raise :class:`SchemaError` listing the valid names when ``keys`` has one outside ``valid``."""
    unknown = sorted(set(keys) - set(valid))
    if unknown:
        raise SchemaError(f"{where}: unknown {what}(s) {unknown}; expected some of {sorted(valid)}")


def as_mapping(data: Any, where: str) -> dict[str, Any]:
    """``data`` as a dict (``None`` is empty); :class:`SchemaError` when it is not a mapping."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise SchemaError(f"{where}: expected a mapping, got {type(data).__name__} {data!r}")
    return dict(data)


def check_fields(obj: Any, where: str) -> None:
    """Run the rule of every field of the dataclass instance ``obj``, then its ``validate(where)``."""
    for f in dataclasses.fields(obj):
        rule = f.metadata.get("rule")
        if rule is not None:
            rule.check(getattr(obj, f.name), where, f.name)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate(where)


def parse(cls: type[T], data: Any, where: str | None = None, **overrides: Any) -> T:
    """Build and check the dataclass ``cls`` from a mapping (plus keyword ``overrides``).

    Args:
        cls: a dataclass whose fields may carry rules (:func:`option`).
        data: a mapping (``None`` is empty).
        where: how errors name the record (default: the class name).
        overrides: values that replace those of ``data``.

    Raises:
        SchemaError: for a non-mapping, an unknown key, a missing required field or a value its
            rule refuses; the message names the key and what was expected.
    """
    where = where or cls.__name__
    merged = {**as_mapping(data, where), **overrides}
    valid = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    check_known(merged, valid, where)
    try:
        obj = cls(**merged)
    except TypeError as exc:  # a missing required field
        raise SchemaError(f"{where}: {exc}") from None
    check_fields(obj, where)
    return obj


def field_names(cls: type) -> list[str]:
    """The option names of a config dataclass, in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if f.init]
