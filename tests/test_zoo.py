"""The model zoo: every model imports, its parameter bytes equal the PyTorch module's."""

from __future__ import annotations

import pytest

from placement_rl import zoo
from placement_rl.errors import UnknownNameError

EXPECTED_PARAMS = {  # standard architectures' parameter counts
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "inception_v3": 23_834_568,
    "bert_large": 335_174_458,
}


@pytest.mark.parametrize("name", zoo.names())
def test_param_bytes_equal_the_modules(name: str, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    module, _ = zoo.build_module(name)
    expected = sum(p.numel() * p.element_size() for p in module.parameters())
    graph = zoo_graph(name)
    assert graph.param_bytes == expected
    assert graph.batch_size == zoo.spec(name).default_batch_size
    assert graph.forward_flops > 0 and graph.backward_flops > graph.forward_flops
    # The graph ends in the training loss, which reduces the batch away (TAG "sum").
    assert graph.ops[-1].op_type == "cross_entropy" and graph.ops[-1].split == "sum"
    # Every costed op with a batch axis has the sample dim at the batch size (or a multiple: B*S tokens).
    for op in graph.ops:
        if op.sample_dim is not None:
            assert op.sample_dim.size % graph.batch_size == 0, op.name
    if name in EXPECTED_PARAMS:
        assert expected == EXPECTED_PARAMS[name] * 4


def test_batch_size_scales_activations_not_parameters(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    small = zoo_graph("resnet50", batch_size=8)
    big = zoo_graph("resnet50")  # 64
    assert small.param_bytes == big.param_bytes
    assert big.forward_flops == pytest.approx(small.forward_flops * 8, rel=1e-6)


def test_options_reach_the_architecture(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    two_steps = zoo_graph("rnnlm", steps=2)
    forty = zoo_graph("rnnlm")
    cells = lambda g: sum(op.op_type == "lstm_cell" for op in g.ops)  # noqa: E731
    assert cells(two_steps) == 2 * 2 and cells(forty) == 2 * 40
    assert two_steps.param_bytes == forty.param_bytes  # unrolled steps share the layer's weights


def test_unknown_names_list_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match="unknown model 'resnet9000'; expected one of: .*inception_v3"):
        zoo.load("resnet9000")
    with pytest.raises(UnknownNameError, match="unknown option of model 'rnnlm' 'colour'; expected one of: .*steps"):
        zoo.load("rnnlm", colour="red")
    with pytest.raises(ValueError, match="batch_size = 0"):
        zoo.load("lenet", batch_size=0)
