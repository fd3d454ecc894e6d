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
name the model's code reads from its config, such as DeBERTa-v2's ``position_buckets``), once; an
integer option must be an integer, sizes (``hidden_size``, ``num_hidden_layers``, ``vocab_size``, ...)
from 1 to :data:`MAX_SIZE`, and numbers finite; a value must be of a kind the config's field declares
(no list or object where an integer belongs; an integer where only a float belongs is taken as that
float, and a note says so); epsilons and rotary bases above 0, dropout probabilities from 0 to 1, an
activation option one of transformers' activations, token ids the user gives inside the vocabulary.
A ``config.json`` is checked the same way (keys that neither the config nor the model's code reads
are kept, unchecked: they cannot change the graph), after its JSON (a key given twice, a trailing
comma) and its ``model_type`` (the class of ``architectures[0]``). Before a model of more than a few
hundred layers is built, its modules and parameter bytes are estimated from builds at one and two
layers; one over :data:`MAX_HF_MODULES` modules or :data:`MAX_HF_PARAM_BYTES` bytes is refused.

Factories (``package.module:factory``) must be Python functions or classes of a module outside the
standard library; whatever they raise becomes a ``ValueError`` naming the string, and so does what
they return when it is not a module with inputs its forward takes. Building and tracing a model that
takes more than a few seconds says so on stderr; ``timeout_s`` (:func:`time_limit`, the ``import``
command's ``--timeout``) ends it with a ``ValueError``. Models are traced without their key/value
cache (:func:`placement_rl.graph.tracing.cache_off`). Runs of at least
:data:`placement_rl.graph.repeats.DEFAULT_MIN_STEPS` repeated steps (an unrolled scan, as Mamba's CPU
path) are collapsed into one op each (:mod:`placement_rl.graph.repeats`; ``metadata["repeats"]``).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import json
import math
import re
import signal
import sys
import threading
import time
import types
import typing
import warnings
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

#: The ``import`` command's default ``--timeout``: seconds building and tracing a model may take.
IMPORT_TIMEOUT_S = 600.0
#: The longest time limit accepted (30 days, as search budgets; ``setitimer`` overflows far above).
MAX_TIMEOUT_S = 30 * 86400.0

#: Seconds of building or tracing before stderr says a model is still being imported, then every this many.
PROGRESS_AFTER_S = 5.0
PROGRESS_EVERY_S = 30.0

# Config attributes that bound the token positions, the first one present wins.
_POSITION_LIMITS = ("max_position_embeddings", "n_positions", "max_target_positions")


def load_model(
    spec: str, batch_size: int | None = None, seq_len: int | None = None, *, timeout_s: float | None = None
) -> OpGraph:
    """The graph of model string ``spec`` (module docstring), with the batch size and sequence length.

    Args:
        spec: a model string (module docstring).
        batch_size: samples per step (default: the model's).
        seq_len: tokens per sample of an ``hf:`` model.
        timeout_s: the most seconds building and tracing a model (``hf:``, a factory, a zoo model) may
            take, ``None`` for no limit (the ``import`` command's ``--timeout``, default
            :data:`IMPORT_TIMEOUT_S`); see :func:`time_limit`.

    Raises:
        UnknownNameError: an unknown zoo model, ``hf:`` class or config option (the valid names are listed).
        ValueError: a bad option or size, a ``seq_len`` past the model's positions, a graph file with a
            batch size, a factory that is not a function or class of the user's, that raises, that
            returns something else than a module and its inputs or inputs its forward refuses, an export
            failure (naming the op and source line), an ``hf:`` model over :data:`MAX_HF_MODULES` modules
            or :data:`MAX_HF_PARAM_BYTES` bytes of parameters, or a build past ``timeout_s``.
        ImportError: ``hf:`` without ``transformers`` installed (``pip install placement-rl[hf]``).
    """
    check_size("--batch-size", batch_size)
    check_size("--seq-len", seq_len)
    check_timeout(timeout_s)
    if spec.startswith("hf:"):
        from placement_rl.graph.aten import from_export

        with (
            still_running(f"building and tracing model {spec!r} with torch.export"),
            time_limit(timeout_s, f"model {spec!r}: building and tracing") as limit,
        ):
            module, args, kwargs = build_hf(spec[3:], batch_size or HF_BATCH_SIZE, seq_len)
            limit.phase = f"model {spec!r}: tracing {type(module).__name__} with torch.export"
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
        return _collapse(_load_factory(spec, batch_size, timeout_s), spec)
    from placement_rl import zoo

    with time_limit(timeout_s, f"model {spec!r}: building and tracing the zoo model"):
        return zoo.load(spec, batch_size=batch_size)


def check_timeout(timeout_s: Any) -> None:
    """``timeout_s`` is ``None`` or a number of seconds above 0, at most :data:`MAX_TIMEOUT_S`; else a
    ``ValueError`` naming it."""
    if timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(
            f"timeout_s = {timeout_s!r}; expected a positive number of seconds (at most {MAX_TIMEOUT_S:g}, 30 days), "
            "or None for no limit"
        )


class _TimeLimitReached(BaseException):
    """Raised in the main thread by :func:`time_limit`'s alarm. A ``BaseException``, so that the
    ``except Exception`` of a factory or of torch does not swallow it on its way out."""


class TimeLimit:
    """What :func:`time_limit` is timing: ``phase`` (set it as the work goes on) opens the error message."""

    def __init__(self, phase: str) -> None:
        self.phase = phase


@contextmanager
def time_limit(timeout_s: float | None, phase: str) -> Iterator[TimeLimit]:
    """Raise a ``ValueError`` when the block runs longer than ``timeout_s`` seconds (``None``: no limit).

    A ``SIGALRM`` timer (``signal.setitimer``) interrupts the main thread wherever it is, a Python loop
    or a ``sleep``, with an exception that ``except Exception`` does not catch; the message is the
    block's ``phase`` (:class:`TimeLimit`), the limit and what to do. The previous ``SIGALRM`` handler
    and timer (an outer limit, pytest's) are restored afterwards, the outer timer less the time spent
    here. Outside the main thread, or where there is no ``SIGALRM`` (Windows), signals cannot reach the
    work: the block runs without a limit and a ``RuntimeWarning`` says so.

    Raises:
        ValueError: ``"<phase> did not finish within the limit of <timeout_s> s ..."``, when it did not.
    """
    limit = TimeLimit(phase)
    if timeout_s is None:
        yield limit
        return
    check_timeout(timeout_s)
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        warnings.warn(
            f"{phase}: the time limit of {timeout_s:g} s needs SIGALRM in the main thread; not applied here",
            RuntimeWarning,
            stacklevel=3,
        )
        yield limit
        return

    def alarm(signum: int, frame: Any) -> None:
        raise _TimeLimitReached

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, alarm)
    outer_delay_s, outer_interval_s = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    if 0 < outer_delay_s < timeout_s:  # an outer limit that ends first keeps its own time
        signal.setitimer(signal.ITIMER_REAL, outer_delay_s, outer_interval_s)
        signal.signal(signal.SIGALRM, previous)
        yield limit
        return
    try:
        yield limit
    except _TimeLimitReached:
        raise ValueError(
            f"{limit.phase} did not finish within the time limit of {timeout_s:g} s (--timeout, timeout_s); "
            "expected it to finish in time: check that it returns at all, or give a larger --timeout (0: no limit)"
        ) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay_s > 0:  # the outer timer goes on, less the time spent here (at least a moment)
            left_s = max(outer_delay_s - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left_s, outer_interval_s)


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


def _load_factory(spec: str, batch_size: int | None, timeout_s: float | None = None) -> OpGraph:
    """The graph of a ``package.module:factory`` string: built, then traced (:func:`from_torch`).

    Raises:
        ValueError: from :func:`build_factory`; when tracing fails, naming the factory, what it returned
            and what was expected (:func:`placement_rl.graph.tracing.forward_error` tells a forward that
            refuses the inputs from one that torch.export cannot trace); past ``timeout_s``.
    """
    from placement_rl.graph.importer import from_torch
    from placement_rl.graph.tracing import forward_error

    attr = spec.partition(":")[2]
    with (
        still_running(f"building and tracing model {spec!r}"),
        time_limit(timeout_s, f"model {spec!r}: the factory {attr}()") as limit,
    ):
        module, inputs = build_factory(spec, batch_size)
        limit.phase = f"model {spec!r}: tracing the {type(module).__name__} that {attr}() returned"
        try:
            graph = from_torch(module, tuple(inputs), name=spec, metadata={"model_spec": spec})
        except UnknownNameError:
            raise
        except ValueError as exc:
            returned = f"{attr}() returned {_describe_made(module, inputs)}"
            refused = forward_error(module, inputs)
            if refused is not None:
                raise ValueError(
                    f"model {spec!r}: {returned}, and {type(module).__name__}.forward fails on those inputs: "
                    f"{refused.rstrip('.')}; expected inputs of the number, shapes and dtypes its forward takes "
                    "(dimension 0 of each is the batch)"
                ) from exc
            raise ValueError(f"model {spec!r}: {returned}, and importing it failed: {_one_line(exc)}") from exc
    if "use_cache" in graph.metadata:
        print(f"note: {spec}: key/value caching {graph.metadata['use_cache']}", file=sys.stderr)
    return graph


def _describe_made(module: nn.Module, inputs: Any) -> str:
    """``"Linear and inputs ((2, 5) float32)"``: what a factory returned, in a few words."""
    items = inputs if isinstance(inputs, tuple | list) else (inputs,)
    return f"{type(module).__name__} and inputs ({', '.join(_describe_value(x) for x in items)})"


def _describe_value(value: Any) -> str:
    """A tensor as ``(2, 5) float32``, anything else as its type's name."""
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return type(value).__name__


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (the lines of a multi-line message joined)."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return text or type(exc).__name__


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
    source = f"{attr}()"
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        module, inputs = made
    elif isinstance(made, nn.Module):
        make_inputs = getattr(mod, f"{attr}_inputs", None)
        if make_inputs is None:
            raise ValueError(
                f"model {spec!r}: {attr}() returned a module; expected (module, inputs) or a function "
                f"{attr}_inputs(batch_size) in {module_name}"
            )
        source = f"{attr}_inputs()"
        module, inputs = made, _call_factory(spec, f"{attr}_inputs", make_inputs, {}, device, batch_size or 1)
    elif isinstance(made, tuple | list):
        items = ", ".join(_describe_value(x) for x in made[:4]) + (", ..." if len(made) > 4 else "")
        raise ValueError(
            f"model {spec!r}: {attr}() returned a {type(made).__name__} of {len(made)} item(s) ({items}); expected "
            "nn.Module or a pair (module, inputs)"
        )
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
    if not any(isinstance(x, torch.Tensor) for x in inputs):
        listed = ", ".join(_describe_value(x) for x in inputs[:4]) or "none"
        raise ValueError(
            f"model {spec!r}: {source} returned example inputs without a tensor ({listed}); expected a tuple of "
            "tensors, dimension 0 of each the batch"
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
    """``"a=1,b=true,c=silu"`` -> ``{"a": 1, "b": True, "c": "silu"}`` (values JSON, else strings).

    Raises:
        ValueError: an item that is not ``key=value``, an empty item (a trailing, leading or doubled
            comma), a key given twice, or a JSON object value with a key given twice.
    """
    out: dict[str, Any] = {}
    if not text.strip():
        return out
    for part in _split_top_level(text):
        item = part.strip()
        if not item:
            raise ValueError(
                f"config overrides {text!r}: an empty item (a trailing, leading or doubled comma); expected "
                "key=value[,key=value...]"
            )
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"config override {item!r}: expected key=value")
        if key in out:
            raise ValueError(
                f"config override {key} is given twice ({key}={json.dumps(out[key])} and {item}); expected each key "
                "once"
            )
        try:
            out[key] = json.loads(value, object_pairs_hook=_unique_keys)
        except _DuplicateKeyError as exc:
            raise ValueError(f"config override {item!r}: {exc}") from None
        except json.JSONDecodeError:
            out[key] = value.strip()
    return out


class _DuplicateKeyError(ValueError):
    """A JSON object with a key given twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object, refused when a key comes twice (JSON's last-wins
    would silently drop the first value)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(
                f"key {key!r} is given twice ({json.dumps(out[key])} and {json.dumps(value)}); expected each key once"
            )
        out[key] = value
    return out


def read_config_json(path: Path) -> dict[str, Any]:
    """A ``config.json`` file as a dict: one JSON object, each key once.

    Raises:
        ValueError: naming the file, for a file that cannot be read, is not JSON (the line and column,
            and whether a trailing comma is the cause), is not an object, or has a key twice (at any depth).
    """
    where = f"hf:{path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot read the config file ({exc})") from None
    try:
        values = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as exc:
        raise ValueError(f"{where}: {exc}") from None
    except json.JSONDecodeError as exc:
        before, after = text[: exc.pos].rstrip(), text[exc.pos :].lstrip()
        if before.endswith(",") and after[:1] in ("}", "]"):
            line = text.count("\n", 0, len(before)) + 1
            raise ValueError(
                f"{where}: a trailing comma at line {line} before {after[:1]!r}; expected JSON, which allows no "
                "comma after the last item"
            ) from None
        raise ValueError(f"{where}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(values, dict):
        kind = type(values).__name__
        raise ValueError(f"{where}: the file holds a JSON {kind}; expected a transformers config object")
    return values


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
        UnknownNameError: an unknown class, config option or ``model_type``.
        ValueError: a bad size or config value, from an override or the file (naming the key, the value and
            what is expected); a config file that is not JSON, has a key twice, or whose ``model_type`` is not
            its architecture's; a model over :data:`MAX_HF_MODULES` modules or :data:`MAX_HF_PARAM_BYTES`
            bytes of parameters (estimated before it is built).
    """
    try:
        import transformers
    except ImportError as exc:
        raise ImportError("hf: models need transformers: pip install 'placement-rl[hf]'") from exc
    check_size("batch_size", batch_size)
    check_size("seq_len", seq_len)
    head, _, rest = text.partition(":")
    overrides = _nest_overrides(parse_overrides(rest))
    from_file = head.endswith(".json")
    if from_file:
        path = Path(head)
        if not path.is_file():
            raise ValueError(f"hf:{head}: no such config file")
        values = read_config_json(path)
        if "model_type" not in values:
            raise ValueError(f"hf:{head}: expected a transformers config.json with a 'model_type'")
        architectures = values.get("architectures") or []
        if not isinstance(architectures, list) or not architectures:
            raise ValueError(
                f"hf:{head}: architectures = {architectures!r}; expected a list naming one model class or more"
            )
        class_name = architectures[0]
    else:
        class_name, values = head, {}
    cls = getattr(transformers, class_name, None) if isinstance(class_name, str) and class_name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module) and hasattr(cls, "config_class")):
        raise UnknownNameError("hf: model class", class_name, hf_class_names())
    config_cls = cls.config_class
    given: dict[str, str] = {}  # the token-id keys set by the user -> where (checked against the vocabulary)
    if from_file:
        model_type = values.pop("model_type")
        _check_model_type(f"hf:{head}", class_name, config_cls, model_type)
        values = _check_overrides(cls, config_cls, values, f"hf:{head}:", known_only=True)
        if "vocab_size" not in overrides:  # a vocabulary shrunk by an override leaves the file's ids behind
            given.update({k: f"hf:{head}:" for k in _token_id_keys(values)})
    overrides = _check_overrides(cls, config_cls, overrides, "config override")
    given.update({k: "config override" for k in _token_id_keys(overrides)})
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    try:
        if from_file:
            config = transformers.AutoConfig.for_model(model_type, **values)
        else:
            config = config_cls(**values)
    except Exception as exc:  # the config's own checks (transformers' strict dataclass fields, ...)
        raise ValueError(f"hf:{text}: {config_cls.__name__} refuses the config: {_one_line(exc)}") from exc
    _check_token_ids(config, given)
    for name, sub in _sub_configs(config).items():
        _check_token_ids(sub, {k.partition(".")[2]: w for k, w in given.items() if k.startswith(f"{name}.")}, name)
    inputs = _hf_inputs(cls, config, batch_size, seq_len, device)  # checks seq_len before building
    _check_model_size(cls, config, f"hf:{text}")  # an estimate, before a build that could take hours
    try:
        with torch.device(device):
            module = cls(config)
    except Exception as exc:
        raise ValueError(f"hf:{text}: building {cls.__name__} failed: {_build_failure(config, exc)}") from exc
    modules, param_bytes = _module_size(module)
    _refuse_size(f"hf:{text}", modules, param_bytes, "counted on the built model")
    return module, (), inputs


# ------------------------------------------------------------------------------ model size
#: The most modules (layer objects) an ``hf:`` model may have: tracing takes about 10 ms per module, so an
#: import stays within minutes. Llama-2-70B has 1,047; a layer of a transformer 10 to 15.
MAX_HF_MODULES = 20_000
#: The most bytes of parameters an ``hf:`` model may have: a petabyte, the graph format's bound on one op's
#: parameters (:data:`placement_rl.graph.ir.MAX_TENSOR_BYTES`); GPT-3 175B has 7e11 in fp32.
MAX_HF_PARAM_BYTES = 10**15
# Models with at most this many layers in all are built as they are (a second or two) and counted exactly;
# deeper ones are estimated first from builds at 1 and 2 layers.
_LAYERS_BUILT_AT_ONCE = 256
# Config keys that count layers: n_layer, num_hidden_layers, encoder_layers, num_decoder_layers, depth.
_LAYER_KEY = re.compile(r"(^|_)layers?$|^depth$")


def _module_size(module: nn.Module) -> tuple[int, int]:
    """``(modules, parameter bytes)`` of a built module (on the meta device: no memory)."""
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    return sum(1 for _ in module.modules()), params


def _layer_keys(config: Any) -> list[tuple[Any, str, int, str]]:
    """``(config object, key, layers, dotted name)`` for each layer count of ``config`` and its nested configs."""
    found: list[tuple[Any, str, int, str]] = []
    for prefix, obj in (("", config), *((f"{n}.", c) for n, c in _sub_configs(config).items())):
        try:
            keys = list(obj.to_dict())
        except Exception:
            continue
        for key in keys:
            value = getattr(obj, key, None)
            if _LAYER_KEY.search(key) and isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                found.append((obj, key, value, prefix + key))
    return found


def _check_model_size(cls: type[nn.Module], config: Any, where: str) -> None:
    """Refuse a model estimated over :data:`MAX_HF_MODULES` modules or :data:`MAX_HF_PARAM_BYTES` bytes of
    parameters, before building it: from builds of the config at 1 layer and at 2 layers of each layer
    count (``n_layer``, ``encoder_layers``, ...), extrapolated linearly. Models of at most
    ``_LAYERS_BUILT_AT_ONCE`` layers in all are left to the exact count after their build (quick)."""
    layers = _layer_keys(config)
    if sum(n for _, _, n, _ in layers) <= _LAYERS_BUILT_AT_ONCE:
        return

    def built(doubled: int | None) -> tuple[int, int]:
        """The size at 1 layer for every layer count, 2 for the ``doubled``-th one."""
        shrunk = copy.deepcopy(config)
        for i, (obj, key, _, _) in enumerate(_layer_keys(shrunk)):
            setattr(obj, key, 2 if i == doubled else 1)
        with torch.device("meta"):
            return _module_size(cls(shrunk))

    try:
        base_modules, base_bytes = built(None)
        modules, param_bytes, terms = base_modules, base_bytes, []
        for index, (_, _, count, key) in enumerate(layers):
            more_modules, more_bytes = built(index)
            modules += (count - 1) * (more_modules - base_modules)
            param_bytes += (count - 1) * (more_bytes - base_bytes)
            terms.append(f"{more_modules - base_modules} more per layer of {key} = {count:,}")
    except Exception:  # a config that cannot be shrunk (per-layer lists): its build is counted instead
        return
    how = f"estimated from the config: {base_modules} modules at one layer, {', '.join(terms)}"
    _refuse_size(where, modules, param_bytes, how)


def _refuse_size(where: str, modules: int, param_bytes: int, how: str) -> None:
    """A ``ValueError`` when ``modules`` or ``param_bytes`` is over its bound, naming both and ``how``."""
    if modules <= MAX_HF_MODULES and param_bytes <= MAX_HF_PARAM_BYTES:
        return
    raise ValueError(
        f"{where}: the model has about {modules:,} modules and {param_bytes:.3g} bytes of parameters ({how}); "
        f"expected at most {MAX_HF_MODULES:,} modules (tracing takes about 10 ms each) and {MAX_HF_PARAM_BYTES:.0e} "
        "bytes of parameters (the graph's bound on one op's): fewer layers or smaller sizes"
    )


def _build_failure(config: Any, exc: BaseException) -> str:
    """Why building a model from ``config`` failed, on one line: an unknown activation name is named with its
    key (transformers raises a bare ``KeyError: 'foo'``)."""
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        from transformers.activations import ACT2FN

        name = exc.args[0]
        for obj_name, obj in (("", config), *((f"{n}.", s) for n, s in _sub_configs(config).items())):
            for key in obj.to_dict():
                if getattr(obj, key, None) == name:
                    valid = ", ".join(sorted(ACT2FN))
                    return f"{obj_name}{key} = {name!r} is not an activation; expected one of: {valid}"
    return _one_line(exc)


def _check_model_type(where: str, class_name: str, config_cls: type, model_type: Any) -> None:
    """The file's ``model_type`` names ``config_cls`` (or a subclass): the class its ``architectures[0]`` takes.

    Raises:
        UnknownNameError: a ``model_type`` transformers does not know.
        ValueError: one that is not the architecture's.
    """
    from transformers import CONFIG_MAPPING

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise UnknownNameError(f"model_type of {where}", model_type, list(CONFIG_MAPPING.keys()))
    file_cls = CONFIG_MAPPING[model_type]
    if not issubclass(file_cls, config_cls):
        raise ValueError(
            f"{where}: architectures[0] = {class_name!r} takes a {config_cls.__name__} (model_type "
            f"{getattr(config_cls, 'model_type', '?')!r}), but the file's model_type is {model_type!r} "
            f"({file_cls.__name__}); expected an architecture of model_type {model_type!r}, or the model_type "
            f"of {class_name}"
        )


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


def _check_overrides(
    model_cls: type,
    config_cls: type,
    overrides: dict[str, Any],
    where: str = "config override",
    known_only: bool = False,
) -> dict[str, Any]:
    """Every key is one ``config_cls`` takes and every value fits it (module docstring), nested ones too.

    Args:
        model_cls: the model class (the names its code reads from a config are keys too).
        config_cls: its config class.
        overrides: key -> value; a nested config's values as a dict under its name.
        where: what the messages start with (``"config override"``, ``"hf:path/config.json:"``).
        known_only: keep the keys neither the config nor the model's code reads as they are, unchecked
            (a ``config.json`` carries such notes, ``n_ctx``, ``task_specific_params``: they cannot change
            the graph), instead of refusing them.

    Returns:
        The values, an integer where a float belongs (``rms_norm_eps=1``) taken as that float.

    Raises:
        UnknownNameError: a key the config does not take (the valid names listed), unless ``known_only``.
        ValueError: a value of the wrong kind or out of range (naming the key, the value and what is expected).
    """
    if not overrides:
        return {}
    sub_classes: dict[str, type] = dict(getattr(config_cls, "sub_configs", None) or {})
    valid, defaults = _config_keys(model_cls, config_cls)
    types = _field_types(config_cls)
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in sub_classes and isinstance(value, dict):
            sub_cls = sub_classes[key]
            sub_valid, sub_defaults = _config_keys(model_cls, sub_cls)
            sub_types = _field_types(sub_cls)
            checked: dict[str, Any] = {}
            for sub_key, sub_value in value.items():
                if sub_key not in sub_valid:
                    if known_only:
                        checked[sub_key] = sub_value
                        continue
                    raise UnknownNameError(f"option of {sub_cls.__name__} ({key})", sub_key, sub_valid)
                checked[sub_key] = _check_value(
                    where, f"{key}.{sub_key}", sub_value, sub_defaults.get(sub_key), sub_types.get(sub_key)
                )
                _say_coerced(where, f"{key}.{sub_key}", sub_value, checked[sub_key])
            out[key] = checked
            continue
        if key not in valid:
            if known_only:
                out[key] = value
                continue
            raise UnknownNameError(f"option of {config_cls.__name__}", key, valid | set(sub_classes))
        out[key] = _check_value(where, key, value, defaults.get(key), types.get(key))
        _say_coerced(where, key, value, out[key])
    return out


def _say_coerced(where: str, key: str, given: Any, taken: Any) -> None:
    """A note on stderr when :func:`_check_value` took an integer as a float (``layer_norm_epsilon=1``)."""
    if type(given) is not type(taken):
        print(f"note: {where} {key} = {given!r} taken as {taken!r} (the option is a float)", file=sys.stderr)


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
    for alias, field_name in (getattr(config_cls, "attribute_map", None) or {}).items():
        if field_name in defaults:  # num_hidden_layers of GPT-2 is its n_layer
            defaults.setdefault(alias, defaults[field_name])
    return names, defaults


def _field_types(config_cls: type) -> dict[str, Any]:
    """The declared type of each field of a (dataclass) config class, by name and attribute alias; types
    written as strings (forward references) are left out."""
    if not dataclasses.is_dataclass(config_cls):
        return {}
    types = {f.name: f.type for f in dataclasses.fields(config_cls) if not isinstance(f.type, str)}
    for alias, field_name in (getattr(config_cls, "attribute_map", None) or {}).items():
        if field_name in types:
            types.setdefault(alias, types[field_name])
    return types


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


# Keys whose values have a range of their own, by name: a norm's epsilon and a rotary base above 0 (a
# negative one gives NaN, not an error), a dropout probability from 0 to 1, a token id from 0.
_POSITIVE_KEY = re.compile(r"(^|_)(eps|epsilon|theta)$")
_PROBABILITY_KEY = re.compile(r"(dropout|pdrop)(_prob|_rate)?$")
_TOKEN_ID_KEY = re.compile(r"_token_ids?$")
# What each kind of JSON value is called in a message.
_KIND_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "none": "null",
    "list": "a list",
    "dict": "an object",
}


def _check_value(where: str, key: str, value: Any, default: Any, declared: Any = None) -> Any:
    """``value`` fits option ``key`` whose default is ``default`` (``None`` when unknown) and whose declared
    type is ``declared`` (a config dataclass field's, ``None`` when unknown); returns it, an integer where
    only a float belongs as that float (``layer_norm_epsilon=1`` is ``1.0``: transformers' strict fields
    refuse the integer).

    Checked: numbers are finite; sizes positive integers up to :data:`MAX_SIZE`; the kind against the
    default's and the declared type (no list or object where an integer belongs); epsilons and rotary
    bases above 0, dropout probabilities from 0 to 1, token ids from 0; an option whose default names an
    activation (``hidden_act``) takes one of ``transformers.activations.ACT2FN``.

    Raises:
        ValueError: ``"<where> <key> = <value>; expected <what>"``.
    """
    name = key.rpartition(".")[2]

    def refuse(expected: str) -> ValueError:
        return ValueError(f"{where} {key} = {value!r}; expected {expected}")

    if isinstance(value, list | dict):
        for item in value.values() if isinstance(value, dict) else value:
            if isinstance(item, float) and not math.isfinite(item):
                raise refuse("finite numbers")
    if isinstance(value, float) and not math.isfinite(value):
        raise refuse("a finite number")
    kinds = _declared_kinds(declared)
    int_default = isinstance(default, int) and not isinstance(default, bool)
    size = bool(_SIZE_KEY.search(name)) and (default is None or (int_default and default >= 1))
    if isinstance(value, list | dict):
        kind = "list" if isinstance(value, list) else "dict"
        if kinds is not None and kind not in kinds:
            raise refuse(_expected(kinds, size))
        if isinstance(value, dict):  # rope_parameters: its epsilons, bases and probabilities
            for sub_key, sub_value in value.items():
                if isinstance(sub_key, str) and (_POSITIVE_KEY.search(sub_key) or _PROBABILITY_KEY.search(sub_key)):
                    _check_range(where, f"{key}.{sub_key}", sub_value)
        return value
    if value is None:
        if kinds is not None and "none" not in kinds:
            raise refuse(_expected(kinds, size))
        return value
    # an integer option, unless its declared type says a number or something else: Mamba's time_step_rank "auto"
    if (int_default or size) and (kinds is None or kinds & {"int"} and "float" not in kinds):
        expected = f"a positive integer (at most {MAX_SIZE})" if size else f"an integer (magnitude at most {MAX_SIZE})"
        if isinstance(value, bool) or not isinstance(value, int):
            if kinds is None or _kind(value) not in kinds:
                raise refuse(expected)
        elif (size and not 1 <= value <= MAX_SIZE) or abs(value) > MAX_SIZE:
            raise refuse(expected)
    elif isinstance(default, bool) and not isinstance(value, bool):
        raise refuse("true or false")
    elif isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise refuse("a number")
    kind = _kind(value)
    if kinds is not None and kind not in kinds:
        if kind == "int" and "float" in kinds:
            value = float(value)
        else:
            raise refuse(_expected(kinds, size))
    elif isinstance(default, float) and kind == "int" and kinds is None:
        value = float(value)
    _check_range(where, key, value)
    if isinstance(value, str) and isinstance(default, str):
        _check_activation(where, key, value, default)
    return value


def _kind(value: Any) -> str:
    """The JSON kind of a value: ``int``, ``float``, ``bool``, ``str``, ``none``, ``list`` or ``dict``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "dict" if isinstance(value, dict) else "list"


def _declared_kinds(declared: Any) -> frozenset[str] | None:
    """The JSON kinds a declared field type takes (``int | None`` -> ``{"int", "none"}``), ``None`` when
    some part of it is not understood (a ``Literal``, a class)."""
    if declared is None:
        return None
    origin = typing.get_origin(declared)
    if origin in (typing.Union, types.UnionType):
        kinds: set[str] = set()
        for arg in typing.get_args(declared):
            part = _declared_kinds(arg)
            if part is None:
                return None
            kinds |= part
        return frozenset(kinds)
    if origin in (list, tuple):
        return frozenset({"list"})
    if origin is dict:
        return frozenset({"dict"})
    table = {int: "int", float: "float", bool: "bool", str: "str", type(None): "none", list: "list", tuple: "list"}
    if declared in table:
        return frozenset({table[declared]})
    if declared is dict:
        return frozenset({"dict"})
    if isinstance(declared, type):
        try:
            if issubclass(declared, dict) or hasattr(declared, "to_dict"):  # a TypedDict, a nested config
                return frozenset({"dict"})
        except TypeError:
            return None
    return None


def _expected(kinds: frozenset[str], size: bool) -> str:
    """``"a positive integer (at most 16777216)"`` or ``"an integer or null"``: the declared kinds in words."""
    words = [
        f"a positive integer (at most {MAX_SIZE})" if k == "int" and size else _KIND_WORDS[k]
        for k in ("int", "float", "bool", "str", "list", "dict", "none")
        if k in kinds
    ]
    return " or ".join(words)


def _check_range(where: str, key: str, value: Any) -> None:
    """Epsilons and rotary bases above 0, dropout probabilities from 0 to 1, token ids from 0."""
    name = key.rpartition(".")[2]
    numbers = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in numbers):
        return
    if _POSITIVE_KEY.search(name) and not all(v > 0 for v in numbers):
        raise ValueError(f"{where} {key} = {value!r}; expected a number above 0")
    if _PROBABILITY_KEY.search(name) and not all(0 <= v <= 1 for v in numbers):
        raise ValueError(f"{where} {key} = {value!r}; expected a probability from 0 to 1")
    if _TOKEN_ID_KEY.search(name) and not all(isinstance(v, int) and v >= 0 for v in numbers):
        raise ValueError(f"{where} {key} = {value!r}; expected a token id (an integer from 0, below vocab_size)")


def _check_activation(where: str, key: str, value: str, default: str) -> None:
    """An option whose default names an activation function (``hidden_act = "silu"``) takes one too; T5's
    ``feed_forward_proj`` may add ``gated-``."""
    from transformers.activations import ACT2FN

    if default.removeprefix("gated-") not in ACT2FN:
        return
    if value.removeprefix("gated-" if key.endswith("feed_forward_proj") else "") not in ACT2FN:
        gated = " (with gated- in front, or not)" if key.endswith("feed_forward_proj") else ""
        valid = ", ".join(sorted(ACT2FN))
        raise ValueError(f"{where} {key} = {value!r}; expected an activation{gated}, one of: {valid}")


def _sub_configs(config: Any) -> dict[str, Any]:
    """The nested configs of ``config`` (CLIP's ``text_config`` and ``vision_config``), by name."""
    names = getattr(type(config), "sub_configs", None) or {}
    return {n: getattr(config, n) for n in names if getattr(config, n, None) is not None}


def _token_id_keys(values: dict[str, Any]) -> list[str]:
    """The token-id keys of config values (``pad_token_id``, ``text_config.eos_token_id``), dotted when nested."""
    keys = [k for k in values if _TOKEN_ID_KEY.search(k)]
    for name, sub in values.items():
        if isinstance(sub, dict):
            keys += [f"{name}.{k}" for k in sub if isinstance(k, str) and _TOKEN_ID_KEY.search(k)]
    return keys


def _check_token_ids(config: Any, given: dict[str, str], prefix: str = "") -> None:
    """Token ids fit the vocabulary: one the user gave (``given``: key -> where) past it is an error; a
    default past a shrunk vocabulary (GPT-2's 50256 at ``vocab_size=100``) would fail an embedding's
    padding check, so it is cleared to 0.

    Raises:
        ValueError: ``"<where> pad_token_id = 1000 is past the vocabulary (vocab_size = 100); ..."``.
    """
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int):
        return
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(config, key, None)
        ids = value if isinstance(value, list) else [value]
        if not any(isinstance(v, int) and v >= vocab for v in ids):
            continue
        if key in given:
            name = f"{prefix}.{key}" if prefix else key
            raise ValueError(
                f"{given[key]} {name} = {value!r} is past the vocabulary (vocab_size = {vocab}); expected a token "
                f"id from 0 to {vocab - 1}, or null"
            )
        if isinstance(value, int):
            setattr(config, key, 0)
        else:
            setattr(config, key, [v if not isinstance(v, int) or v < vocab else 0 for v in ids])
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
    "IMPORT_TIMEOUT_S",
    "MAX_HF_MODULES",
    "MAX_HF_PARAM_BYTES",
    "MAX_SIZE",
    "MAX_TIMEOUT_S",
    "TimeLimit",
    "build_factory",
    "build_hf",
    "check_size",
    "check_timeout",
    "hf_class_names",
    "load_model",
    "parse_overrides",
    "read_config_json",
    "still_running",
    "time_limit",
]
