"""Bad input to the model importer: ``hf:`` configs (overrides and ``config.json`` files) checked alike, models
over the size bound refused before they are built, the zoo's options, the ``import --timeout`` limit,
factories that return the wrong thing, and Hugging Face models built with their default key/value cache.

Each bad input is one ``error:`` line through :func:`placement_rl.cli.main` (status 2), asserted as written.
This module is importable as ``test_importer_bad_input``: its factories are model strings."""

from __future__ import annotations

import json
import re
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from placement_rl import models, zoo
from placement_rl.cli import main
from placement_rl.graph.tracing import cache_off, forward_error

pytest.importorskip("transformers")

#: A one-layer GPT-2 small enough to build in a blink.
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 1, "n_embd": 32, "n_head": 2}
GPT2_OVERRIDES = "n_layer=1,n_embd=32,n_head=2,vocab_size=100,n_positions=64"
LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "vocab_size": 100,
}
ACTIVATIONS = (
    "gelu, gelu_10, gelu_accurate, gelu_fast, gelu_new, gelu_python, gelu_python_tanh, gelu_pytorch_tanh, hardswish, "
    "laplace, leaky_relu, linear, mish, prelu, quick_gelu, relu, relu2, relu6, sigmoid, silu, sqrtsoftplus, swish, "
    "tanh, xielu"
)


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one ``error:`` line of a refused command (status 2, nothing else on stderr but notes)."""
    status = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("note:", "[transformers]"))]
    assert status == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _import(model: str, tmp_path: Path, *extra: str) -> list[str]:
    return ["import", model, "--out", str(tmp_path / "graph.json"), *extra]


# ----------------------------------------------------------------- config.json files, checked like overrides
CONFIG_FILE_CASES = {
    "negative-width": (GPT2, {"n_embd": -64}, "n_embd = -64; expected a positive integer (at most 16777216)"),
    "float-for-int": (GPT2, {"n_layer": 2.0}, "n_layer = 2.0; expected a positive integer (at most 16777216)"),
    "string-for-int": (GPT2, {"n_layer": "two"}, "n_layer = 'two'; expected a positive integer (at most 16777216)"),
    "mapping-for-int": (
        GPT2,
        {"n_layer": {"a": 1}},
        "n_layer = {'a': 1}; expected a positive integer (at most 16777216)",
    ),
    "unknown-activation": (
        GPT2,
        {"activation_function": "foo"},
        f"activation_function = 'foo'; expected an activation, one of: {ACTIVATIONS}",
    ),
    "negative-epsilon": (GPT2, {"layer_norm_epsilon": -1e-5}, "layer_norm_epsilon = -1e-05; expected a number above 0"),
    "pad-past-vocabulary": (
        GPT2,
        {"vocab_size": 100, "pad_token_id": 1000},
        "pad_token_id = 1000 is past the vocabulary (vocab_size = 100); expected a token id from 0 to 99, or null",
    ),
    "negative-rope-theta": (LLAMA, {"rope_theta": -1.0}, "rope_theta = -1.0; expected a number above 0"),
    "negative-rope-theta-nested": (
        LLAMA,
        {"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}},
        "rope_parameters.rope_theta = -1.0; expected a number above 0",
    ),
}


@pytest.mark.parametrize("case", list(CONFIG_FILE_CASES))
def test_a_config_file_is_checked_like_overrides(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, change, message = CONFIG_FILE_CASES[case]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **change}))
    assert _error(_import(f"hf:{path}", tmp_path), capsys) == f"error: hf:{path}: {message}"
    assert not (tmp_path / "graph.json").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"model_type": "gpt2", "n_layer": 1, "n_layer": 2}',
            "key 'n_layer' is given twice (1 and 2); expected each key once",
        ),
        (
            '{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "x": {"a": 1, "a": 1}}',
            "key 'a' is given twice (1 and 1); expected each key once",
        ),
        (
            '{"model_type": "gpt2",\n "n_layer": 1,\n}',
            "a trailing comma at line 2 before '}'; expected JSON, which allows no comma after the last item",
        ),
        (
            '{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel",]}',
            "a trailing comma at line 1 before ']'; expected JSON, which allows no comma after the last item",
        ),
        ('{"model_type": "gpt2" "n_layer": 1}', "not valid JSON: Expecting ',' delimiter at line 1 column 23"),
        ("[1, 2]", "the file holds a JSON list; expected a transformers config object"),
    ],
    ids=["duplicate-key", "duplicate-nested-key", "trailing-comma", "trailing-comma-in-list", "not-json", "a-list"],
)
def test_a_config_file_must_be_one_json_object_with_each_key_once(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    assert _error(_import(f"hf:{path}", tmp_path), capsys) == f"error: hf:{path}: {message}"


def test_the_architecture_must_take_the_files_model_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GPT2, "architectures": ["BertForMaskedLM"]}))
    assert _error(_import(f"hf:{path}", tmp_path), capsys) == (
        f"error: hf:{path}: architectures[0] = 'BertForMaskedLM' takes a BertConfig (model_type 'bert'), but the "
        "file's model_type is 'gpt2' (GPT2Config); expected an architecture of model_type 'gpt2', or the model_type "
        "of BertForMaskedLM"
    )


def test_a_config_file_keeps_the_keys_no_code_reads_and_takes_an_int_epsilon_as_a_float(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GPT2, "vocab_size": 100, "n_ctx": 1024, "layer_norm_epsilon": 1}))
    module, _, _ = models.build_hf(f"{path}:n_positions=64", 1, 8)
    assert module.config.n_ctx == 1024  # a note of the file's: kept, unchecked
    assert module.config.layer_norm_epsilon == 1.0 and isinstance(module.config.layer_norm_epsilon, float)
    assert f"note: hf:{path}: layer_norm_epsilon = 1 taken as 1.0 (the option is a float)" in capsys.readouterr().err


# ----------------------------------------------------------------- key=value overrides
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "n_layer=1,n_layer=2",
            "config override n_layer is given twice (n_layer=1 and n_layer=2); expected each key once",
        ),
        (
            "n_layer=1,",
            "config overrides 'n_layer=1,': an empty item (a trailing, leading or doubled comma); expected "
            "key=value[,key=value...]",
        ),
        (
            ",n_layer=1",
            "config overrides ',n_layer=1': an empty item (a trailing, leading or doubled comma); expected "
            "key=value[,key=value...]",
        ),
        (
            'a={"b": 1, "b": 2}',
            """config override 'a={"b": 1, "b": 2}': key 'b' is given twice (1 and 2); expected each """
            "key once",
        ),
    ],
    ids=["duplicate", "trailing-comma", "leading-comma", "duplicate-in-a-json-value"],
)
def test_overrides_are_key_value_items_each_key_once(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        models.parse_overrides(text)
    assert str(info.value) == message
    assert models.parse_overrides("a=1,b=[1,2],c=silu") == {"a": 1, "b": [1, 2], "c": "silu"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ('n_layer={"a": 1}', "config override n_layer = {'a': 1}; expected a positive integer"),
        ("n_layer=[1]", "config override n_layer = [1]; expected a positive integer"),
        ("n_layer=2.0", "config override n_layer = 2.0; expected a positive integer"),
        ("activation_function=foo", "config override activation_function = 'foo'; expected an activation, one of: "),
        ("layer_norm_epsilon=-1e-5", "config override layer_norm_epsilon = -1e-05; expected a number above 0"),
        ("attn_pdrop=1.5", "config override attn_pdrop = 1.5; expected a probability from 0 to 1"),
        ("pad_token_id=-5", "config override pad_token_id = -5; expected a token id (an integer from 0"),
        ("pad_token_id=1000", "config override pad_token_id = 1000 is past the vocabulary (vocab_size = 100)"),
        ("eos_token_id=[1,1000]", "config override eos_token_id = [1, 1000] is past the vocabulary"),
    ],
    ids=["mapping", "list", "float", "activation", "epsilon", "dropout", "negative-id", "id-past", "ids-past"],
)
def test_bad_overrides_are_refused(overrides: str, message: str) -> None:
    keys = {item.partition("=")[0] for item in overrides.split(",")}
    base = ",".join(item for item in GPT2_OVERRIDES.split(",") if item.partition("=")[0] not in keys)
    with pytest.raises(ValueError, match=re.escape(message)):
        models.build_hf(f"GPT2LMHeadModel:{base},{overrides}", 1, 8)


def test_llama_overrides_are_checked_like_gpt2s(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    base = "num_hidden_layers=1,hidden_size=32,intermediate_size=64,num_attention_heads=2,vocab_size=100"
    assert _error(_import(f"hf:LlamaForCausalLM:{base},rope_theta=-1.0", tmp_path), capsys) == (
        "error: config override rope_theta = -1.0; expected a number above 0"
    )
    assert _error(_import(f"hf:LlamaForCausalLM:{base},hidden_act=swiglu", tmp_path), capsys) == (
        f"error: config override hidden_act = 'swiglu'; expected an activation, one of: {ACTIVATIONS}"
    )
    module, _, _ = models.build_hf(f"LlamaForCausalLM:{base},rms_norm_eps=1", 1, 8)
    assert module.config.rms_norm_eps == 1.0 and isinstance(module.config.rms_norm_eps, float)


def test_a_default_token_id_past_a_shrunk_vocabulary_is_cleared() -> None:
    module, _, _ = models.build_hf(f"GPT2LMHeadModel:{GPT2_OVERRIDES}", 1, 8)  # GPT-2's ids are 50256
    assert module.config.bos_token_id == 0 and module.config.eos_token_id == 0


# ----------------------------------------------------------------- sizes over the bound
def test_a_model_over_the_module_bound_is_refused_before_it_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = "hf:GPT2LMHeadModel:n_layer=16000000,n_embd=32,n_head=2,vocab_size=100,n_positions=64"
    assert _error(_import(spec, tmp_path), capsys) == (
        f"error: {spec}: the model has about 208,000,008 modules and 8.13e+11 bytes of parameters (estimated from "
        "the config: 21 modules at one layer, 13 more per layer of n_layer = 16,000,000); expected at most 20,000 "
        "modules (tracing takes about 10 ms each) and 1e+15 bytes of parameters (the graph's bound on one op's): "
        "fewer layers or smaller sizes"
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GPT2, "n_layer": 16_000_000, "vocab_size": 100, "n_positions": 64}))
    assert "the model has about 208,000,008 modules" in _error(_import(f"hf:{path}", tmp_path), capsys)


def test_the_estimate_is_the_built_models_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Estimated from builds at one and two layers, the module count and parameter bytes of a four-layer
    GPT-2 and of a two-tower T5 are what the built models have."""
    for spec in (
        "GPT2LMHeadModel:n_layer=4,n_embd=32,n_head=2,vocab_size=100,n_positions=64",
        "T5ForConditionalGeneration:num_layers=3,num_decoder_layers=2,d_model=32,d_ff=64,num_heads=2,d_kv=16,"
        "vocab_size=100",
    ):
        module, _, _ = models.build_hf(spec, 1, 8)
        modules, param_bytes = models._module_size(module)
        monkeypatch.setattr(models, "_LAYERS_BUILT_AT_ONCE", 1)
        monkeypatch.setattr(models, "MAX_HF_MODULES", 1)
        with pytest.raises(
            ValueError, match=re.escape(f"about {modules:,} modules and {param_bytes:.3g} bytes")
        ) as info:
            models.build_hf(spec, 1, 8)
        assert "estimated from the config" in str(info.value)
        monkeypatch.undo()


def test_a_model_over_the_parameter_bound_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = "hf:GPT2LMHeadModel:n_layer=1,n_embd=16000000,n_head=1,vocab_size=16000000,n_positions=64"
    assert _error(_import(spec, tmp_path), capsys).startswith(
        f"error: {spec}: the model has about 21 modules and 1.33e+16 bytes of parameters (counted on the built "
        "model); expected at most 20,000 modules"
    )


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "gpt",
            {"num_layers": -1},
            "model 'gpt': option num_layers = -1; expected a positive integer (at most 16777216)",
        ),
        ("gpt", {"hidden": "x"}, "model 'gpt': option hidden = 'x'; expected a positive integer (at most 16777216)"),
        ("gpt", {"heads": True}, "model 'gpt': option heads = True; expected a positive integer (at most 16777216)"),
        (
            "gpt",
            {"num_layers": 10**7},
            "model 'gpt': num_layers x steps = 10,000,000 x 1 = 10,000,000, which the op count grows with; expected at "
            "most 10,000 (an import within minutes)",
        ),
        (
            "rnnlm",
            {"num_layers": 100, "steps": 1000},
            "model 'rnnlm': num_layers x steps = 100 x 1,000 = 100,000, which the op count grows with; expected at "
            "most 10,000 (an import within minutes)",
        ),
        (
            "inception_v3",
            {"dropout": 1.5},
            "model 'inception_v3': option dropout = 1.5; expected a probability from 0 to 1",
        ),
        (
            "wideresnet",
            {"width_factor": float("inf")},
            "model 'wideresnet': option width_factor = inf; expected a finite number above 0",
        ),
    ],
)
def test_zoo_options_are_checked_before_building(name: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        zoo.build_module(name, batch_size=2, **options)
    assert str(info.value) == message


# ----------------------------------------------------------------- the time limit
def never_returns() -> nn.Module:
    """A factory that never returns (it waits on an event nobody sets)."""
    threading.Event().wait()
    raise AssertionError("unreachable")


def test_a_factory_that_never_returns_ends_at_the_time_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handler = signal.getsignal(signal.SIGALRM)
    spec = "test_importer_bad_input:never_returns"
    assert _error(_import(spec, tmp_path, "--timeout", "0.2"), capsys) == (
        f"error: model {spec!r}: the factory never_returns() did not finish within the time limit of 0.2 s "
        "(--timeout, timeout_s); expected it to finish in time: check that it returns at all, or give a larger "
        "--timeout (0: no limit)"
    )
    assert signal.getsignal(signal.SIGALRM) == handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with pytest.raises(
        ValueError, match="the factory never_returns[(][)] did not finish within the time limit of 0.2 s"
    ):
        models.load_model(spec, timeout_s=0.2)


def test_the_time_limit_gives_back_an_outer_timer() -> None:
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 3600.0)
        with models.time_limit(60.0, "nothing"):
            assert signal.getitimer(signal.ITIMER_REAL)[0] <= 60.0  # the inner limit runs
        left_s, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 3500.0 < left_s <= 3600.0 and not fired  # the outer one goes on
        with models.time_limit(7200.0, "nothing"):  # an outer timer that ends first is kept as it is
            assert signal.getitimer(signal.ITIMER_REAL)[0] <= 3600.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_time_limit_outside_the_main_thread_warns_that_it_is_not_applied() -> None:
    caught: list[warnings.WarningMessage] = []

    def work() -> None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with models.time_limit(1.0, "building m"):
                pass
        caught.extend(seen)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert [str(w.message) for w in caught] == [
        "building m: the time limit of 1 s needs SIGALRM in the main thread; not applied here"
    ]


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 1e12, True, "600"])
def test_bad_library_time_limits_are_refused(value: object) -> None:
    with pytest.raises(ValueError) as info:
        models.load_model("lenet", timeout_s=value)  # type: ignore[arg-type]
    assert str(info.value) == (
        f"timeout_s = {value!r}; expected a positive number of seconds (at most 2.592e+06, 30 days), or None for "
        "no limit"
    )


def test_the_import_command_states_its_time_limit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from placement_rl.cli import describe

    assert describe.IMPORT_TIMEOUT_S == models.IMPORT_TIMEOUT_S == 600
    assert describe.MAX_TIMEOUT_S == models.MAX_TIMEOUT_S
    assert main(["import", "--help"]) == 0
    assert "(default 600; 0 for no limit)" in " ".join(capsys.readouterr().out.split())
    for bad in ("-1", "1e12", "nan"):
        assert main(_import("lenet", tmp_path, "--timeout", bad)) == 2
        expected = "a finite number" if bad == "nan" else "a number of seconds from 0 (no limit) to 2.592e+06 (30 days)"
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"placement-rl import: error: argument --timeout: {bad!r}: expected {expected}"
        )


# ----------------------------------------------------------------- factories that return the wrong thing
def three_things() -> tuple[nn.Module, tuple[torch.Tensor, ...], int]:
    return nn.Linear(8, 4), (torch.empty(2, 8),), 5


def no_tensor() -> tuple[nn.Module, tuple[str]]:
    return nn.Linear(8, 4), ("abc",)


def wrong_width() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return nn.Linear(8, 4), (torch.empty(2, 5),)


def two_inputs_for_one() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return nn.Linear(8, 4), (torch.empty(2, 8), torch.empty(2, 8))


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (
            "three_things",
            "three_things() returned a tuple of 3 item(s) (Linear, tuple, int); expected nn.Module or a pair "
            "(module, inputs)",
        ),
        (
            "no_tensor",
            "no_tensor() returned example inputs without a tensor (str); expected a tuple of tensors, dimension 0 of "
            "each the batch",
        ),
    ],
)
def test_a_factory_returning_the_wrong_thing_is_one_error(
    factory: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"test_importer_bad_input:{factory}"
    assert _error(_import(spec, tmp_path), capsys) == f"error: model {spec!r}: {message}"


def test_forward_error_names_what_the_forward_refuses() -> None:
    assert forward_error(nn.Linear(8, 4), (torch.empty(2, 8),)) is None
    assert forward_error(nn.Linear(8, 4), (torch.empty(2, 5),)) == (
        "RuntimeError: a and b must have same reduction dim, but got [2, 5] X [8, 4]."
    )
    refused = forward_error(nn.Linear(8, 4), (torch.empty(2, 8), torch.empty(2, 8)))
    assert refused == "TypeError: Linear.forward() takes 2 positional arguments but 3 were given"


@pytest.mark.parametrize(
    ("factory", "refused"),
    [
        (
            "wrong_width",
            "((2, 5) float32), and Linear.forward fails on those inputs: RuntimeError: a and b must have "
            "same reduction dim, but got [2, 5] X [8, 4]",
        ),
        (
            "two_inputs_for_one",
            "((2, 8) float32, (2, 8) float32), and Linear.forward fails on those inputs: "
            "TypeError: Linear.forward() takes 2 positional arguments but 3 were given",
        ),
    ],
    ids=["wrong-width", "two-inputs-for-one"],
)
def test_a_factory_whose_inputs_its_module_refuses_is_one_error(
    factory: str, refused: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"test_importer_bad_input:{factory}"
    assert _error(_import(spec, tmp_path), capsys) == (
        f"error: model {spec!r}: {factory}() returned Linear and inputs {refused}; expected inputs of the number, "
        "shapes and dtypes its forward takes (dimension 0 of each is the batch)"
    )


# ----------------------------------------------------------------- key/value caching
class _Config:
    """A config with a nested one, both caching (as transformers' configs with ``sub_configs``)."""

    sub_configs = {"text_config": object}

    def __init__(self, nested: bool = True) -> None:
        self.use_cache = True
        self.text_config = _Config(nested=False) if nested else None


class _Cached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = _Config()
        self.inner = nn.Linear(2, 2)
        self.inner.config = self.config  # type: ignore[assignment]  # shared, as a model's layers share it


def test_cache_off_turns_caching_off_for_the_block_and_back_on() -> None:
    module = _Cached()
    with cache_off(module) as note:
        assert module.config.use_cache is False and module.config.text_config.use_cache is False
    assert note == (
        "turned off for the import: config.use_cache, config.text_config.use_cache was True (a training step keeps "
        "no key/value cache, and torch.export cannot return one); the module's config is unchanged"
    )
    assert module.config.use_cache is True and module.config.text_config.use_cache is True
    with cache_off(module, {"use_cache": False}) as note:  # the forward is told itself
        assert note is None and module.config.use_cache is True
    with cache_off(nn.Linear(2, 2)) as note:
        assert note is None


def gpt2_with_its_cache() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """GPT-2 built in Python, with its default ``use_cache=True`` (transformers returns a DynamicCache)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64))
    return model, (torch.zeros(2, 8, dtype=torch.long),)


def test_a_model_built_with_its_cache_imports_without_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = "test_importer_bad_input:gpt2_with_its_cache"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(_import(spec, tmp_path)) == 0
    note = (
        "turned off for the import: config.use_cache was True (a training step keeps no key/value cache, and "
        "torch.export cannot return one); the module's config is unchanged"
    )
    assert f"note: {spec}: key/value caching {note}" in capsys.readouterr().err.splitlines()
    graph = json.loads((tmp_path / "graph.json").read_text())
    assert graph["metadata"]["use_cache"] == note
    assert sum(op["op_type"] == "linear" for op in graph["ops"]) == 5  # c_attn, c_proj, c_fc, c_proj, lm_head


class _ReturnsACache(nn.Module):
    """A module without a config whose forward returns a transformers cache beside its output."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        from transformers import DynamicCache

        return self.inner(x), DynamicCache()


def test_a_cache_among_the_outputs_is_named_with_what_to_do() -> None:
    from placement_rl.graph.aten import ExportError, export_module

    with pytest.raises(ExportError) as info:
        export_module(_ReturnsACache(), (torch.empty(2, 4),))
    assert str(info.value) == (
        "torch.export could not trace _ReturnsACache: its forward returns a key/value cache "
        "(transformers.cache_utils.DynamicCache), which torch.export cannot return and a training step does not "
        "keep; expected a module whose outputs are tensors: turn caching off (config.use_cache = False, or pass "
        "use_cache=False to forward)"
    )
