"""The model zoo: the papers' benchmark models, defined in PyTorch and imported with ``from_torch``.

Models are built under ``torch.device("meta")``: no weights are allocated, so even the 7.3 GB
WideResNet imports in well under a second.

Examples:
    >>> from placement_rl import zoo
    >>> zoo.names()[:3]
    ['lenet', 'alexnet', 'vgg16']
    >>> graph = zoo.load("inception_v3")          # batch 96 as in TAG Table 3
    >>> graph = zoo.load("rnnlm", steps=2)        # FlexFlow sec. 8.3's 2-step variant
"""

from __future__ import annotations

import math
from typing import Any

import torch

from placement_rl.errors import UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.zoo.cnn import MODELS as _CNN_MODELS
from placement_rl.zoo.gpt import MODELS as _GPT_MODELS
from placement_rl.zoo.llama import MODELS as _LLAMA_MODELS
from placement_rl.zoo.sequence import MODELS as _SEQUENCE_MODELS
from placement_rl.zoo.spec import ZooModel

_ORDER = (
    "lenet",
    "alexnet",
    "vgg16",
    "vgg19",
    "resnet50",
    "resnet101",
    "inception_v3",
    "wideresnet",
    "transformer",
    "bert_small",
    "bert_large",
    "gnmt",
    "rnnlm",
    "rnntc",
    "llama",
    "llama_7b",
    "llama3_8b",
    "llama2_70b",
    "gpt",
    "gpt_1.7b",
    "gpt_175b",
    "gpt_1t",
)
_MODELS: dict[str, ZooModel] = {m.name: m for m in (*_CNN_MODELS, *_SEQUENCE_MODELS, *_LLAMA_MODELS, *_GPT_MODELS)}
assert set(_MODELS) == set(_ORDER), sorted(set(_MODELS) ^ set(_ORDER))


def names() -> list[str]:
    """The zoo's model names, CNNs first."""
    return list(_ORDER)


def spec(name: str) -> ZooModel:
    """The :class:`ZooModel` record of ``name``; ``UnknownNameError`` listing valid names otherwise."""
    try:
        return _MODELS[name]
    except KeyError:
        raise UnknownNameError("model", name, _ORDER) from None


#: The largest integer option of a zoo model (a size, a layer or step count), as ``hf:`` sizes.
MAX_OPTION = 2**24
#: The most layers times unrolled steps (``num_layers`` x ``steps``) of a zoo model: its op count grows with
#: them (15 ops a transformer layer, 2 an LSTM layer-step), and tracing takes about 2 ms an op.
MAX_LAYER_STEPS = 10_000


def check(name: str, batch_size: int | None, options: dict[str, Any]) -> tuple[ZooModel, int]:
    """Validate a model name, its options and a batch size; returns the record and the batch size.

    Raises:
        UnknownNameError: for an unknown model or option name.
        ValueError: for a batch size below 1; an integer option that is not one from 1 to
            :data:`MAX_OPTION`, a number option that is not finite and above 0 (a dropout from 0 to 1);
            ``num_layers`` x ``steps`` over :data:`MAX_LAYER_STEPS` (checked before anything is built).
    """
    model = spec(name)
    unknown = set(options) - set(model.options)
    if unknown:
        raise UnknownNameError(f"option of model {name!r}", sorted(unknown)[0], model.options)
    for key, value in options.items():
        default = model.options[key]
        if isinstance(default, int) and not isinstance(default, bool):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OPTION:
                raise ValueError(
                    f"model {name!r}: option {key} = {value!r}; expected a positive integer (at most {MAX_OPTION})"
                )
        elif isinstance(default, float):
            dropout = key == "dropout"  # a probability; other number options are scales (width_factor)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not (0 <= value <= 1 if dropout else 0 < value < math.inf):
                expected = "a probability from 0 to 1" if dropout else "a finite number above 0"
                raise ValueError(f"model {name!r}: option {key} = {value!r}; expected {expected}")
    merged = {**model.options, **options}
    layers, steps = merged.get("num_layers", 1), merged.get("steps", 1)
    if isinstance(layers, int) and isinstance(steps, int) and layers * steps > MAX_LAYER_STEPS:
        raise ValueError(
            f"model {name!r}: num_layers x steps = {layers:,} x {steps:,} = {layers * steps:,}, which the op count "
            f"grows with; expected at most {MAX_LAYER_STEPS:,} (an import within minutes)"
        )
    batch = model.default_batch_size if batch_size is None else batch_size
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch_size = {batch_size!r}; expected a positive integer")
    return model, batch


def build_module(
    name: str, batch_size: int | None = None, **options: Any
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Build model ``name`` on the meta device with its example inputs (no weights allocated).

    Args:
        name: a zoo model name.
        batch_size: global batch size; default the paper's (``spec(name).default_batch_size``).
        **options: architecture options (``spec(name).options`` lists them with their defaults).

    Returns:
        ``(module, example_inputs)``: ``module(*example_inputs)`` is the scalar training loss.

    Raises:
        UnknownNameError: for an unknown model or option name.
        ValueError: for a batch size below 1.
    """
    model, batch = check(name, batch_size, options)
    with torch.device("meta"):
        module = model.build(**options)
    return module, model.example_inputs(batch, **options)


def load(name: str, batch_size: int | None = None, **options: Any) -> OpGraph:
    """Import zoo model ``name`` as an :class:`OpGraph` (see :func:`build_module` for arguments)."""
    from placement_rl.graph.importer import from_torch

    module, inputs = build_module(name, batch_size, **options)
    model = spec(name)
    meta = {"zoo_model": name, "options": {**model.options, **options}, "paper": model.source}
    # The zoo's models are known to train (tests/test_importer_edges.py runs every one through the
    # training-step check), so their imports skip it.
    return from_torch(module, inputs, name=name, metadata=meta, tracer="fx", check_backward=False)


__all__ = ["ZooModel", "build_module", "check", "load", "names", "spec"]
