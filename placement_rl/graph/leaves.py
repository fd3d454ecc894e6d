"""Leaf layers: the module classes the importers keep as one op each, found by ``isinstance``.

Both front ends (``torch.fx`` in :mod:`placement_rl.graph.importer`, ``torch.export`` in
:mod:`placement_rl.graph.aten`) turn a call of a leaf layer into one op of the layer's op type, whose
parameters are the layer's; they never look inside it. A layer is a leaf when its class, or any class
it derives from, is in the built-in table (``torch.nn`` layers such as ``nn.Linear`` or ``nn.LSTM``,
``placement_rl.graph.tracing.MODULE_TYPES``) or was registered here. So a subclass with a forward of
its own, such as Falcon's ``FalconLinear(nn.Linear)`` computing ``input @ self.weight.T``, is a
``linear`` op whose weight can be split, not a transpose and a product of an ``other`` kind.

:func:`register_leaf` adds a class of one's own (a fused layer, a custom norm)::

    from placement_rl.graph import register_leaf

    register_leaf(MyFusedNorm, "rms_norm")

The most derived registered class wins, and at equal depth a registration wins over the built-in
table. This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from placement_rl.ops import OP_KINDS

_REGISTERED: dict[type, str] = {}


def register_leaf(module_cls: type, op_type: str) -> None:
    """Make every instance of ``module_cls`` (and of its subclasses) one op of type ``op_type``.

    Args:
        module_cls: a ``torch.nn.Module`` subclass.
        op_type: an op type of the taxonomy :data:`placement_rl.ops.OP_KINDS` (``"linear"``,
            ``"conv2d"``, ``"rms_norm"``, ...). FLOPs: the export front end counts the layer's own
            ATen calls; the fx front end applies the type's formula (for ``linear`` and ``conv*``
            it reads ``in_features`` / ``out_features`` or the convolution's attributes when the
            class derives from the ``torch.nn`` layer, else the call's shapes).

    Raises:
        ValueError: ``module_cls`` is not a module class, or ``op_type`` has no taxonomy row.
    """
    from torch import nn

    if not (isinstance(module_cls, type) and issubclass(module_cls, nn.Module)):
        raise ValueError(f"register_leaf: module_cls = {module_cls!r}; expected a torch.nn.Module subclass")
    if op_type not in OP_KINDS or op_type in ("input", "constant"):
        raise ValueError(
            f"register_leaf: op_type = {op_type!r}; expected an op type of placement_rl.ops.OP_KINDS "
            "such as 'linear', 'conv2d', 'layer_norm' or 'rms_norm'"
        )
    _REGISTERED[module_cls] = op_type


def unregister_leaf(module_cls: type) -> None:
    """Undo :func:`register_leaf` for ``module_cls`` (nothing happens when it was not registered)."""
    _REGISTERED.pop(module_cls, None)


def registered_leaves() -> dict[type, str]:
    """A copy of the registrations: module class -> op type."""
    return dict(_REGISTERED)


def leaf_op_type(module: Any, table: Mapping[type, str]) -> str | None:
    """The op type of ``module`` if it is a leaf layer, else ``None``.

    The classes of ``type(module).__mro__`` are tried from the most derived: the first one that is
    registered (:func:`register_leaf`) or in ``table`` (the built-in layers) decides.
    """
    for cls in type(module).__mro__:
        op_type = _REGISTERED.get(cls)
        if op_type is None:
            op_type = table.get(cls)
        if op_type is not None:
            return op_type
    return None


__all__ = ["leaf_op_type", "register_leaf", "registered_leaves", "unregister_leaf"]
