"""One resolver from a model string to an :class:`~placement_rl.graph.OpGraph`.

Model strings (every CLI command that takes ``--model`` accepts them):

=====================================  ===============================================================
``resnet50``                           a zoo model (``placement-rl models``)
``graph.json``                         a saved graph (:meth:`OpGraph.to_json`)
``hf:LlamaForCausalLM``                a Hugging Face ``transformers`` model class with its config's
                                       defaults, built on the meta device (no weights, no hub access)
``hf:LlamaForCausalLM:num_hidden_layers=2,hidden_size=256``
                                       the same with config overrides (``key=value``, values parsed
                                       as JSON: ``true``, ``1e-5``, ``[1, 2]``; else a string)
``hf:path/to/config.json[:overrides]``  a local ``config.json``; the class is its ``architectures[0]``
``package.module:factory``             ``factory()`` returns ``nn.Module`` or ``(module, inputs)``; with
                                       a module alone the inputs are ``factory_inputs(batch_size)``
                                       from the same module when defined, else an error
=====================================  ===============================================================

Hugging Face models are traced with ``torch.export`` (:mod:`placement_rl.graph.aten`) on inputs of
``batch_size`` x ``seq_len`` token ids (``pixel_values`` of the config's image size for vision
models, ``input_features`` of the config's length for speech models), with ``labels`` so the graph
is a training step's forward pass including the loss. ``transformers`` is the optional extra ``hf``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from placement_rl.errors import UnknownNameError
from placement_rl.graph import OpGraph

#: Default batch and sequence length of a Hugging Face model string.
HF_BATCH_SIZE = 8
HF_SEQ_LEN = 512

# Config attributes that bound the token positions, the first one present wins.
_POSITION_LIMITS = ("max_position_embeddings", "n_positions", "max_target_positions")


def load_model(spec: str, batch_size: int | None = None, seq_len: int | None = None) -> OpGraph:
    """The graph of model string ``spec`` (module docstring), with the batch size and sequence length.

    Raises:
        UnknownNameError: an unknown zoo model or ``hf:`` class (the valid names are listed).
        ValueError: a bad option, a ``seq_len`` past the model's positions, a graph file with a
            batch size, or an export failure (naming the op and source line).
        ImportError: ``hf:`` without ``transformers`` installed (``pip install placement-rl[hf]``).
    """
    if spec.startswith("hf:"):
        module, args, kwargs = build_hf(spec[3:], batch_size or HF_BATCH_SIZE, seq_len or HF_SEQ_LEN)
        from placement_rl.graph.aten import from_export

        meta = {"model_spec": spec, "seq_len": seq_len or HF_SEQ_LEN}
        return from_export(module, args, kwargs, name=spec, metadata=meta)
    if seq_len is not None:
        raise ValueError(f"--seq-len = {seq_len} applies to hf: models, not to {spec!r}")
    if spec.endswith(".json") or Path(spec).is_file():
        if batch_size is not None:
            raise ValueError("--batch-size applies to zoo models, not to graph files")
        return OpGraph.from_json(spec)
    if ":" in spec:
        return _load_factory(spec, batch_size)
    from placement_rl import zoo

    return zoo.load(spec, batch_size=batch_size)


def _load_factory(spec: str, batch_size: int | None) -> OpGraph:
    module, inputs = build_factory(spec, batch_size)
    from placement_rl.graph.importer import from_torch

    return from_torch(module, tuple(inputs), name=spec, metadata={"model_spec": spec})


def build_factory(
    spec: str, batch_size: int | None, device: str = "meta"
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The module and example inputs of a ``package.module:factory`` string, built under ``device``.

    Raises:
        ValueError: naming the string, when the module does not import, has no such callable, or the
            factory returns something else than a module or ``(module, inputs)``.
    """
    module_name, _, attr = spec.partition(":")
    try:
        mod = _import_from_here(module_name)
    except ImportError as exc:
        raise ValueError(f"model {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise ValueError(f"model {spec!r}: {module_name} has no callable {attr!r}; expected package.module:factory")
    kwargs: dict[str, Any] = {}
    if batch_size is not None and "batch_size" in inspect.signature(factory).parameters:
        kwargs["batch_size"] = batch_size
    with torch.device(device):
        made = factory(**kwargs)
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        module, inputs = made
    elif isinstance(made, nn.Module):
        make_inputs = getattr(mod, f"{attr}_inputs", None)
        if make_inputs is None:
            raise ValueError(
                f"model {spec!r}: {attr}() returned a module; expected (module, inputs) or a function "
                f"{attr}_inputs(batch_size) in {module_name}"
            )
        module, inputs = made, make_inputs(batch_size or 1)
    else:
        raise ValueError(
            f"model {spec!r}: {attr}() returned {type(made).__name__}; expected nn.Module or (module, inputs)"
        )
    return module, tuple(inputs)


def _import_from_here(module_name: str) -> Any:
    """``importlib.import_module``, also finding a module in the current folder (as ``python -m``
    does; the ``placement-rl`` console script does not put the current folder on ``sys.path``)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        here = str(Path.cwd())
        if exc.name != module_name.split(".")[0] or here in sys.path:
            raise
        sys.path.insert(0, here)
        try:
            return importlib.import_module(module_name)
        finally:
            sys.path.remove(here)


def parse_overrides(text: str) -> dict[str, Any]:
    """``"a=1,b=true,c=silu"`` -> ``{"a": 1, "b": True, "c": "silu"}`` (values JSON, else strings)."""
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in _split_top_level(text))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"config override {item!r}: expected key=value")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value.strip()
    return out


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets, so ``a=[1,2],b=3`` is two items."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def hf_class_names() -> list[str]:
    """The ``transformers`` model classes an ``hf:`` string may name (``...For...`` and ``...Model``)."""
    import transformers

    return sorted(
        n
        for n in dir(transformers)
        if ("For" in n or n.endswith("Model")) and not n.startswith(("TF", "Flax")) and n[0].isupper()
    )


def build_hf(
    text: str, batch_size: int, seq_len: int, device: str = "meta"
) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """Build an ``hf:`` model (``text`` without the prefix) on ``device`` (meta: no weights), with its inputs.

    Returns:
        ``(module, args, kwargs)`` for ``module(*args, **kwargs)``: the loss of one training step.
    """
    try:
        import transformers
    except ImportError as exc:
        raise ImportError("hf: models need transformers: pip install 'placement-rl[hf]'") from exc
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size = {batch_size}, seq_len = {seq_len}; expected positive integers")
    head, _, rest = text.partition(":")
    if head.endswith(".json"):
        path = Path(head)
        if not path.is_file():
            raise ValueError(f"hf:{head}: no such config file")
        values = json.loads(path.read_text())
        if not isinstance(values, dict) or "model_type" not in values:
            raise ValueError(f"hf:{head}: expected a transformers config.json with a 'model_type'")
        architectures = values.get("architectures") or []
        if not architectures:
            raise ValueError(f"hf:{head}: the config names no 'architectures'; expected one model class")
        class_name = architectures[0]
        values.update(parse_overrides(rest))
        config_values = values
    else:
        class_name, config_values = head, parse_overrides(rest)
    cls = getattr(transformers, class_name, None) if class_name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module) and hasattr(cls, "config_class")):
        raise UnknownNameError("hf: model class", class_name, hf_class_names())
    config_cls = cls.config_class
    if head.endswith(".json"):
        config = transformers.AutoConfig.for_model(**config_values)
    else:
        config = config_cls(**config_values)
    if not head.endswith(".json"):
        valid = set(config_cls().to_dict())
        for key in config_values:
            if key not in valid and not hasattr(config, f"_{key}"):
                raise UnknownNameError(f"option of {config_cls.__name__}", key, valid)
    _check_token_ids(config)
    inputs = _hf_inputs(cls, config, batch_size, seq_len, device)  # checks seq_len before building
    with torch.device(device):
        module = cls(config)
    return module, (), inputs


def _check_token_ids(config: Any) -> None:
    """Special token ids past a shrunk vocabulary would fail an embedding's padding check: clear them."""
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int):
        return
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value >= vocab:
            setattr(config, key, 0)
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = 0


def _hf_inputs(cls: type[nn.Module], config: Any, batch: int, seq_len: int, device: str) -> dict[str, Any]:
    """Inputs on ``device`` by the model class's main input: token ids, images or audio features, and labels."""
    params = inspect.signature(cls.forward).parameters
    name = getattr(cls, "main_input_name", "input_ids")
    inputs: dict[str, Any] = {}
    tokens = torch.zeros(batch, seq_len, dtype=torch.long, device=device)
    if name == "input_ids":
        _check_positions(config, seq_len)
        inputs["input_ids"] = tokens
    elif name == "pixel_values":
        size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
        inputs["pixel_values"] = torch.empty(batch, config.num_channels, size, size, device=device)
    elif name == "input_features":
        frames = 2 * config.max_source_positions
        inputs["input_features"] = torch.empty(batch, config.num_mel_bins, frames, device=device)
    else:
        raise ValueError(
            f"hf: {cls.__name__}'s main input {name!r}; expected input_ids, pixel_values or input_features"
        )
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        _check_positions(config, seq_len, decoder=True)
        inputs["decoder_input_ids"] = tokens
    if "labels" in params:
        if name == "pixel_values":
            inputs["labels"] = torch.zeros(batch, dtype=torch.long, device=device)
        else:
            inputs["labels"] = tokens
    if "use_cache" in params:
        inputs["use_cache"] = False
    return inputs


def _check_positions(config: Any, seq_len: int, decoder: bool = False) -> None:
    names = ("max_target_positions", *_POSITION_LIMITS) if decoder else _POSITION_LIMITS
    for key in names:
        limit = getattr(config, key, None)
        if isinstance(limit, int):
            if seq_len > limit:
                raise ValueError(f"--seq-len = {seq_len} exceeds the model's {key} = {limit}")
            return


__all__ = ["HF_BATCH_SIZE", "HF_SEQ_LEN", "build_hf", "hf_class_names", "load_model", "parse_overrides"]
