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
``hf:CLIPModel:text_config.num_hidden_layers=1``
                                       an override of a nested config (``text_config``, ``vision_config``)
``hf:path/to/config.json[:overrides]``  a local ``config.json``; the class is its ``architectures[0]``
``package.module:factory``             ``factory()`` returns ``nn.Module`` or ``(module, inputs)``; with
                                       a module alone the inputs are ``factory_inputs(batch_size)``
                                       from the same module when defined, else an error
=====================================  ===============================================================

Hugging Face models are traced with ``torch.export`` (:mod:`placement_rl.graph.aten`) on the inputs
their ``forward`` takes, built from the config: ``batch_size`` x ``seq_len`` token ids
(``input_ids``, and ``decoder_input_ids`` for encoder-decoders), ``pixel_values`` of the (vision)
config's image size and channels, ``input_features`` of the config's length for speech models, with
``labels`` (or ``return_loss=True`` for contrastive image-text models) so the graph is a training
step's forward pass including the loss. ``attention_mask`` is left out: every token attends, which
an all-ones mask would only restate. Without ``--seq-len``, a model whose positions are fewer than
:data:`HF_SEQ_LEN` (CLIP's 77) takes all of them. :data:`HF_CHECKED_CLASSES` lists the classes a
test imports; others of the same kinds usually work. ``transformers`` is the optional extra ``hf``.

Config overrides are checked before anything is built: a key must be one the config class takes
(its constructor over the class hierarchy, the legacy names it converts, such as ``rope_theta``, or a
name the model's code reads from its config, such as DeBERTa-v2's ``position_buckets``); an integer
option must be an integer, sizes (``hidden_size``, ``num_hidden_layers``, ``vocab_size``, ...) from 1
to :data:`MAX_SIZE`, and numbers finite.

Factories (``package.module:factory``) must be Python functions or classes of a module outside the
standard library; whatever they raise becomes a ``ValueError`` naming the string. Building and
tracing a model that takes more than a few seconds says so on stderr. Runs of at least
:data:`placement_rl.graph.repeats.DEFAULT_MIN_STEPS` repeated steps (an unrolled scan, as Mamba's CPU
path) are collapsed into one op each (:mod:`placement_rl.graph.repeats`; ``metadata["repeats"]``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from placement_rl.errors import UnknownNameError
from placement_rl.graph import OpGraph

#: Default batch and sequence length of a Hugging Face model string.
HF_BATCH_SIZE = 8
HF_SEQ_LEN = 512
#: Image side of an ``hf:`` vision model whose config names no ``image_size`` (ResNet, RegNet).
HF_IMAGE_SIZE = 224
#: Raw-audio samples of an ``hf:`` model on ``input_values`` (one second at 16 kHz) and its CTC label length.
HF_AUDIO_SAMPLES = 16000
HF_AUDIO_LABELS = 16
#: The largest batch size, sequence length or config size (``hidden_size``, ``vocab_size``, ...) accepted.
MAX_SIZE = 2**24

#: The ``hf:`` classes a test imports at small sizes (``tests/test_hf.py``), by kind: decoders, encoders,
#: encoder-decoders (with decoder inputs), vision, speech, contrastive image-text (two inputs and
#: ``return_loss``) and a state-space model (its scan collapsed, :mod:`placement_rl.graph.repeats`).
HF_CHECKED_CLASSES: tuple[str, ...] = (
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
    "MixtralForCausalLM",
    "BertForMaskedLM",
    "DebertaV2ForMaskedLM",
    "T5ForConditionalGeneration",
    "BartForConditionalGeneration",
    "ViTForImageClassification",
    "WhisperForConditionalGeneration",
    "CLIPModel",
    "SiglipModel",
    "MambaForCausalLM",
)

#: Seconds of building or tracing before stderr says a model is still being imported, then every this many.
PROGRESS_AFTER_S = 5.0
PROGRESS_EVERY_S = 30.0

# Config attributes that bound the token positions, the first one present wins.
_POSITION_LIMITS = ("max_position_embeddings", "n_positions", "max_target_positions")


def load_model(spec: str, batch_size: int | None = None, seq_len: int | None = None) -> OpGraph:
    """The graph of model string ``spec`` (module docstring), with the batch size and sequence length.

    Raises:
        UnknownNameError: an unknown zoo model, ``hf:`` class or config option (the valid names are listed).
        ValueError: a bad option or size, a ``seq_len`` past the model's positions, a graph file with a
            batch size, a factory that is not a function or class of the user's or that raises, or an
            export failure (naming the op and source line).
        ImportError: ``hf:`` without ``transformers`` installed (``pip install placement-rl[hf]``).
    """
    check_size("--batch-size", batch_size)
    check_size("--seq-len", seq_len)
    if spec.startswith("hf:"):
        from placement_rl.graph.aten import from_export

        with still_running(f"building and tracing model {spec!r} with torch.export"):
            module, args, kwargs = build_hf(spec[3:], batch_size or HF_BATCH_SIZE, seq_len)
            tokens = _hf_seq_len(kwargs)
            meta = {"model_spec": spec, "seq_len": tokens if tokens is not None else (seq_len or HF_SEQ_LEN)}
            graph = from_export(module, args, kwargs, name=spec, metadata=meta)
        return _collapse(graph, spec)
    if seq_len is not None:
        raise ValueError(f"--seq-len = {seq_len} applies to hf: models, not to {spec!r}")
    if spec.endswith(".json") or Path(spec).is_file():
        if batch_size is not None:
            raise ValueError("--batch-size applies to zoo models, not to graph files")
        return OpGraph.from_json(spec)
    if ":" in spec:
        return _collapse(_load_factory(spec, batch_size), spec)
    from placement_rl import zoo

    return zoo.load(spec, batch_size=batch_size)


def check_size(name: str, value: Any) -> None:
    """``value`` is ``None`` or an integer from 1 to :data:`MAX_SIZE`; else a ``ValueError`` naming ``name``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
        raise ValueError(f"{name} = {value!r}; expected a positive integer (at most {MAX_SIZE})")


def _hf_seq_len(inputs: dict[str, Any]) -> int | None:
    """The token length of built ``hf:`` inputs, ``None`` for models without token inputs."""
    for key in ("input_ids", "decoder_input_ids"):
        if isinstance(inputs.get(key), torch.Tensor):
            return int(inputs[key].shape[1])
    return None


def _collapse(graph: OpGraph, spec: str) -> OpGraph:
    """``graph`` with its long repeated step structures collapsed (a note on stderr when there are some)."""
    from placement_rl.graph.repeats import DEFAULT_MIN_STEPS, collapse_repeats

    collapsed = collapse_repeats(graph, min_steps=DEFAULT_MIN_STEPS)
    if collapsed is not graph:
        runs = collapsed.metadata["repeats"]["runs"]
        what = ", ".join(f"{r['steps']} steps of {r['unit_ops']} ops" for r in runs)
        print(
            f"note: {spec}: collapsed {len(runs)} repeated structure(s) ({what}) into one op each: "
            f"{graph.num_ops} -> {collapsed.num_ops} ops (graph metadata 'repeats')",
            file=sys.stderr,
        )
    return collapsed


@contextmanager
def still_running(
    what: str,
    after_s: float = PROGRESS_AFTER_S,
    every_s: float = PROGRESS_EVERY_S,
    write: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Say on stderr (or through ``write``) that ``what`` is still running after ``after_s`` seconds, then
    every ``every_s`` seconds, until the block ends: a slow import or a factory that hangs is not silent."""
    done = threading.Event()
    start = time.perf_counter()
    say = write or (lambda line: print(line, file=sys.stderr, flush=True))

    def watch() -> None:
        wait_s = after_s
        while not done.wait(wait_s):
            say(f"{what} ... still running after {time.perf_counter() - start:.0f} s")
            wait_s = every_s

    thread = threading.Thread(target=watch, name="placement-rl-still-running", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _load_factory(spec: str, batch_size: int | None) -> OpGraph:
    from placement_rl.graph.importer import from_torch

    with still_running(f"building and tracing model {spec!r}"):
        module, inputs = build_factory(spec, batch_size)
        return from_torch(module, tuple(inputs), name=spec, metadata={"model_spec": spec})


_FACTORY_EXPECTED = (
    "expected package.module:factory naming a Python function or class of your own module (not a builtin "
    "or the standard library) that returns nn.Module or (module, inputs)"
)


def build_factory(
    spec: str, batch_size: int | None, device: str = "meta"
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The module and example inputs of a ``package.module:factory`` string, built under ``device``.

    Raises:
        ValueError: naming the string, when the module does not import, is part of the standard library,
            has no such function or class, the factory raises (anything, ``SystemExit`` included; the
            exception is chained), or returns something else than a module or ``(module, inputs)``.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise ValueError(f"model {spec!r}: {module_name!r} is not a dotted module name; {_FACTORY_EXPECTED}")
    if _is_stdlib(module_name):
        raise ValueError(f"model {spec!r}: {module_name!r} is a standard-library module; {_FACTORY_EXPECTED}")
    try:
        mod = _import_from_here(module_name)
    except ImportError as exc:
        raise ValueError(f"model {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    except (Exception, SystemExit) as exc:
        raise ValueError(f"model {spec!r}: importing {module_name} raised {type(exc).__name__}: {exc}") from exc
    factory = getattr(mod, attr, None) if attr.isidentifier() else None
    if not callable(factory):
        raise ValueError(f"model {spec!r}: {module_name} has no callable {attr!r}; {_FACTORY_EXPECTED}")
    if not (inspect.isfunction(factory) or inspect.isclass(factory)):
        kind = "a builtin" if inspect.isbuiltin(factory) else f"a {type(factory).__name__}"
        raise ValueError(f"model {spec!r}: {attr} is {kind}, not a Python function or class; {_FACTORY_EXPECTED}")
    origin = getattr(factory, "__module__", None) or ""
    if origin in ("builtins", "__builtin__") or _is_stdlib(origin):
        raise ValueError(f"model {spec!r}: {attr} comes from the standard library ({origin}); {_FACTORY_EXPECTED}")
    kwargs: dict[str, Any] = {}
    try:
        takes_batch = "batch_size" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        takes_batch = False
    if batch_size is not None and takes_batch:
        kwargs["batch_size"] = batch_size
    made = _call_factory(spec, attr, factory, kwargs, device)
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        module, inputs = made
    elif isinstance(made, nn.Module):
        make_inputs = getattr(mod, f"{attr}_inputs", None)
        if make_inputs is None:
            raise ValueError(
                f"model {spec!r}: {attr}() returned a module; expected (module, inputs) or a function "
                f"{attr}_inputs(batch_size) in {module_name}"
            )
        module, inputs = made, _call_factory(spec, f"{attr}_inputs", make_inputs, {}, device, batch_size or 1)
    else:
        raise ValueError(
            f"model {spec!r}: {attr}() returned {type(made).__name__}; expected nn.Module or (module, inputs)"
        )
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, tuple | list):
        raise ValueError(
            f"model {spec!r}: the example inputs are a {type(inputs).__name__}; expected a tuple of tensors"
        )
    return module, tuple(inputs)


def _call_factory(
    spec: str, name: str, factory: Callable[..., Any], kwargs: dict[str, Any], device: str, *args: Any
) -> Any:
    """``factory(*args, **kwargs)`` under ``device``; whatever it raises becomes a ``ValueError`` naming ``spec``."""
    try:
        with torch.device(device):
            return factory(*args, **kwargs)
    except (Exception, SystemExit) as exc:
        raise ValueError(f"model {spec!r}: {name}() raised {type(exc).__name__}: {exc}") from exc


def _is_stdlib(module_name: str) -> bool:
    """Whether ``module_name`` (dotted) belongs to the standard library or the interpreter's builtins."""
    top = module_name.split(".")[0]
    return top in sys.stdlib_module_names or top in sys.builtin_module_names


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
    text: str, batch_size: int, seq_len: int | None = None, device: str = "meta"
) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """Build an ``hf:`` model (``text`` without the prefix) on ``device`` (meta: no weights), with its inputs.

    Args:
        text: ``Class[:overrides]`` or ``path/config.json[:overrides]``.
        batch_size: samples per step.
        seq_len: tokens per sample; ``None``: :data:`HF_SEQ_LEN`, or all the model's positions when fewer.

    Returns:
        ``(module, args, kwargs)`` for ``module(*args, **kwargs)``: the loss of one training step.

    Raises:
        UnknownNameError: an unknown class or config option.
        ValueError: a bad size or override value (naming the key, the value and what is expected).
    """
    try:
        import transformers
    except ImportError as exc:
        raise ImportError("hf: models need transformers: pip install 'placement-rl[hf]'") from exc
    check_size("batch_size", batch_size)
    check_size("seq_len", seq_len)
    head, _, rest = text.partition(":")
    overrides = _nest_overrides(parse_overrides(rest))
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
    else:
        class_name, values = head, {}
    cls = getattr(transformers, class_name, None) if isinstance(class_name, str) and class_name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module) and hasattr(cls, "config_class")):
        raise UnknownNameError("hf: model class", class_name, hf_class_names())
    config_cls = cls.config_class
    _check_overrides(cls, config_cls, overrides)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    if head.endswith(".json"):
        config = transformers.AutoConfig.for_model(**values)
    else:
        config = config_cls(**values)
    _check_token_ids(config)
    for sub in _sub_configs(config).values():
        _check_token_ids(sub)
    inputs = _hf_inputs(cls, config, batch_size, seq_len, device)  # checks seq_len before building
    with torch.device(device):
        module = cls(config)
    return module, (), inputs


# ------------------------------------------------------------------------------ config overrides
# Config keys that are sizes: a positive integer (a key whose default is 0 or negative, a sentinel such
# as DeBERTa's max_relative_positions = -1, may keep such values).
_SIZE_KEY = re.compile(
    r"^(num_|n_)|(_size|_dim|_layers|_heads|_positions|_experts|_channels|_length|_tok)$|^(d_model|d_ff|d_kv|dim)$"
)


def _nest_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """``{"text_config.num_hidden_layers": 1}`` -> ``{"text_config": {"num_hidden_layers": 1}}``."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        parent, dot, child = key.partition(".")
        if not dot:
            if isinstance(out.get(key), dict) and isinstance(value, dict):
                out[key] = {**value, **out[key]}
            else:
                out[key] = value
            continue
        if not parent or not child or "." in child:
            raise ValueError(f"config override {key!r}: expected key or sub_config.key (one level)")
        nested = out.setdefault(parent, {})
        if not isinstance(nested, dict):
            raise ValueError(f"config override {key!r}: {parent} is also given a value ({nested!r})")
        nested[child] = value
    return out


def _check_overrides(model_cls: type, config_cls: type, overrides: dict[str, Any]) -> None:
    """Every key is one ``config_cls`` takes and every value fits it (module docstring), nested ones too.

    Raises:
        UnknownNameError: a key the config does not take (the valid names listed).
        ValueError: a value of the wrong kind or out of range (naming the key, the value and what is expected).
    """
    if not overrides:
        return
    sub_classes: dict[str, type] = dict(getattr(config_cls, "sub_configs", None) or {})
    valid, defaults = _config_keys(model_cls, config_cls)
    for key, value in overrides.items():
        if key in sub_classes and isinstance(value, dict):
            sub_valid, sub_defaults = _config_keys(model_cls, sub_classes[key])
            for sub_key, sub_value in value.items():
                if sub_key not in sub_valid:
                    raise UnknownNameError(f"option of {sub_classes[key].__name__} ({key})", sub_key, sub_valid)
                _check_value(f"{key}.{sub_key}", sub_value, sub_defaults.get(sub_key))
            continue
        if key not in valid:
            raise UnknownNameError(f"option of {config_cls.__name__}", key, valid | set(sub_classes))
        _check_value(key, value, defaults.get(key))


def _config_keys(model_cls: type, config_cls: type) -> tuple[set[str], dict[str, Any]]:
    """The option names ``config_cls`` accepts for ``model_cls``, and their default values.

    The names: the constructor's parameters over the class hierarchy, the legacy names its code takes
    from ``kwargs`` (``rope_theta``), the default config's attributes (``attn_implementation`` for
    ``_attn_implementation`` too) and attribute aliases, and the names the model's module reads from a
    config (``config.position_buckets``, ``getattr(config, "share_att_key", ...)``).
    """
    names: set[str] = set()
    for klass in config_cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            try:
                params = inspect.signature(init).parameters.values()
            except (TypeError, ValueError):
                params = []  # type: ignore[assignment]
            names |= {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)} - {"self"}
        names |= _names_in_source(klass, _KWARGS_NAMES)
    try:
        default = config_cls()
    except Exception:  # a config that needs arguments: its signature and the model's reads only
        default = None
    attributes = dict(vars(default)) if default is not None else {}
    as_dict = default.to_dict() if default is not None else {}
    names |= set(as_dict) | {k.lstrip("_") for k in attributes} | set(getattr(config_cls, "attribute_map", {}))
    names |= _names_in_source(sys.modules.get(model_cls.__module__), _CONFIG_READS)
    defaults = {**{k.lstrip("_"): v for k, v in attributes.items()}, **as_dict}
    return names, defaults


_KWARGS_NAMES = (re.compile(r"kwargs\.(?:pop|get)\(\s*[\"'](\w+)[\"']"),)
_CONFIG_READS = (
    re.compile(r"\bconfig\.(\w+)"),
    re.compile(r"getattr\(\s*[\w.]*config\s*,\s*[\"'](\w+)[\"']"),
)


def _names_in_source(obj: Any, patterns: tuple[re.Pattern[str], ...]) -> set[str]:
    """The names ``patterns`` capture in ``obj``'s source (a class or module); none when it has no source."""
    if obj is None:
        return set()
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return set()
    return {name for pattern in patterns for name in pattern.findall(source)}


def _check_value(key: str, value: Any, default: Any) -> None:
    """``value`` fits option ``key`` whose default is ``default`` (``None`` when unknown); lists and
    objects (``image_size=[32, 32]``) are left to the config, except for non-finite numbers in them."""
    if isinstance(value, list | dict):
        for item in value.values() if isinstance(value, dict) else value:
            if isinstance(item, float) and not math.isfinite(item):
                raise ValueError(f"config override {key} = {value!r}; expected finite numbers")
        return
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"config override {key} = {value!r}; expected a finite number")
    int_default = isinstance(default, int) and not isinstance(default, bool)
    size = bool(_SIZE_KEY.search(key.rpartition(".")[2])) and (default is None or (int_default and default >= 1))
    if int_default or size:
        expected = f"a positive integer (at most {MAX_SIZE})" if size else f"an integer (magnitude at most {MAX_SIZE})"
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config override {key} = {value!r}; expected {expected}")
        if (size and not 1 <= value <= MAX_SIZE) or abs(value) > MAX_SIZE:
            raise ValueError(f"config override {key} = {value!r}; expected {expected}")
    elif isinstance(default, bool) and not isinstance(value, bool):
        raise ValueError(f"config override {key} = {value!r}; expected true or false")
    elif isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError(f"config override {key} = {value!r}; expected a number")


def _sub_configs(config: Any) -> dict[str, Any]:
    """The nested configs of ``config`` (CLIP's ``text_config`` and ``vision_config``), by name."""
    names = getattr(type(config), "sub_configs", None) or {}
    return {n: getattr(config, n) for n in names if getattr(config, n, None) is not None}


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


# ------------------------------------------------------------------------------------- inputs
def _hf_inputs(cls: type[nn.Module], config: Any, batch: int, seq_len: int | None, device: str) -> dict[str, Any]:
    """The inputs of one training step on ``device``, from ``cls.forward``'s parameters and ``config``.

    Shapes: ``input_ids``, ``decoder_input_ids`` and token ``labels`` ``(batch, seq_len)`` int64;
    ``pixel_values`` ``(batch, channels, size, size)`` and image-class ``labels`` ``(batch,)``;
    ``input_features`` ``(batch, num_mel_bins, 2 * max_source_positions)``; ``input_values``
    ``(batch, HF_AUDIO_SAMPLES)`` float and CTC ``labels`` ``(batch, HF_AUDIO_LABELS)``. Images are
    ``HF_IMAGE_SIZE`` square when the config names no size.
    """
    params = inspect.signature(cls.forward).parameters
    name = getattr(cls, "main_input_name", "input_ids")
    contrastive = "return_loss" in params  # CLIP, SigLIP: both towers, and the loss
    text = getattr(config, "text_config", None) or config
    inputs: dict[str, Any] = {}
    if name not in ("input_ids", "pixel_values", "input_features", "input_values"):
        raise ValueError(
            f"hf: {cls.__name__}'s main input {name!r}; expected input_ids, pixel_values, input_features "
            "or input_values"
        )
    tokens: torch.Tensor | None = None
    if "input_ids" in params and (name == "input_ids" or contrastive):
        length = _positions(text, seq_len)
        tokens = torch.zeros(batch, length, dtype=torch.long, device=device)
        inputs["input_ids"] = tokens
    if "pixel_values" in params and (name == "pixel_values" or contrastive):
        vision = getattr(config, "vision_config", None) or config
        image_size = getattr(vision, "image_size", HF_IMAGE_SIZE)  # CNN configs (ResNet, RegNet) have none
        size = image_size if isinstance(image_size, int) else image_size[0]
        channels = getattr(vision, "num_channels", 3)
        inputs["pixel_values"] = torch.empty(batch, channels, size, size, device=device)
    if name == "input_values":  # raw audio (wav2vec 2.0, HuBERT): HF_AUDIO_SAMPLES samples, CTC labels
        inputs["input_values"] = torch.empty(batch, HF_AUDIO_SAMPLES, device=device)
        if "labels" in params:
            inputs["labels"] = torch.ones(batch, HF_AUDIO_LABELS, dtype=torch.long, device=device)
    if name == "input_features":
        frames = 2 * config.max_source_positions
        inputs["input_features"] = torch.empty(batch, config.num_mel_bins, frames, device=device)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        length = _positions(config, seq_len, decoder=True)
        if tokens is None or tokens.shape[1] != length:
            tokens = torch.zeros(batch, length, dtype=torch.long, device=device)
        inputs["decoder_input_ids"] = tokens
    if "labels" in params and name != "input_values":
        if name == "pixel_values":
            inputs["labels"] = torch.zeros(batch, dtype=torch.long, device=device)
        elif tokens is not None:
            inputs["labels"] = tokens
    if contrastive:
        inputs["return_loss"] = True
    if "use_cache" in params:
        inputs["use_cache"] = False
    return inputs


def _positions(config: Any, seq_len: int | None, decoder: bool = False) -> int:
    """The token length: ``seq_len``, checked against the model's positions; without one, :data:`HF_SEQ_LEN`
    or all the positions when fewer."""
    names = ("max_target_positions", *_POSITION_LIMITS) if decoder else _POSITION_LIMITS
    for key in names:
        limit = getattr(config, key, None)
        if isinstance(limit, int):
            if seq_len is None:
                return min(HF_SEQ_LEN, limit)
            if seq_len > limit:
                raise ValueError(f"--seq-len = {seq_len} exceeds the model's {key} = {limit}")
            break
    return seq_len or HF_SEQ_LEN


__all__ = [
    "HF_BATCH_SIZE",
    "HF_CHECKED_CLASSES",
    "HF_SEQ_LEN",
    "MAX_SIZE",
    "build_factory",
    "build_hf",
    "check_size",
    "hf_class_names",
    "load_model",
    "parse_overrides",
    "still_running",
]
