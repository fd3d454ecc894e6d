"""Op profiling: entries for every costed op of a zoo graph, at the full batch and its partitions."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from placement_rl.errors import UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.profiling import profile_models
from placement_rl.sim.cost import ProfileTable


@pytest.fixture(scope="module")
def lenet_table() -> Iterator[ProfileTable]:
    """LeNet at batch 8 and its 2-way partitions (batch 4), profiled once for the module.

    Single-threaded: on small shared VMs, waking the second intra-op thread can stall an op for
    milliseconds, far longer than LeNet's ops take. The tests check what was recorded (which keys,
    finite non-negative times), never how measured times compare: those depend on the machine's load.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield profile_models(["lenet"], batch_size=8, batch_splits=(1, 2), repeats=2, progress=False)
    finally:
        torch.set_num_threads(threads)


def _costed_keys(graph: OpGraph) -> set[tuple[str, str, tuple[int, ...], int]]:
    return {("CPU", op.op_type, tuple(op.output_shapes[0]), op.param_bytes) for op in graph.ops if op.forward_flops > 0}


def test_entries_cover_the_batch_and_its_partitions(
    lenet_table: ProfileTable, zoo_graph: Callable[..., OpGraph]
) -> None:
    assert lenet_table.device.startswith("CPU")
    full, half = zoo_graph("lenet", batch_size=8), zoo_graph("lenet", batch_size=4)
    full_conv, half_conv = (next(op for op in g.ops if op.op_type == "conv2d") for g in (full, half))
    assert full_conv.output_shapes[0] == (8, 6, 28, 28) and half_conv.output_shapes[0] == (4, 6, 28, 28)
    # Exactly one entry per distinct costed (op type, shape, parameter bytes) of either batch size:
    # the partitions' shapes are measured, not scaled from the full batch, and nothing else is recorded.
    assert set(lenet_table.entries) == _costed_keys(full) | _costed_keys(half)
    batched = {key for key in _costed_keys(full) if key[2][:1] == (8,)}
    assert len(batched) == 11  # every op but the scalar loss carries the batch axis
    for device_type, op_type, shape, param_bytes in batched:
        assert lenet_table.lookup(device_type, op_type, (4, *shape[1:]), param_bytes) is not None
    for entry in lenet_table.entries.values():
        for seconds in (entry.forward_s, entry.backward_s):
            assert math.isfinite(seconds) and seconds >= 0
    assert lenet_table.lookup("CPU", "conv2d", full_conv.output_shapes[0], full_conv.param_bytes).forward_s > 0


def test_every_costed_op_finds_an_entry(lenet_table: ProfileTable, zoo_graph: Callable[..., OpGraph]) -> None:
    for batch_size in (8, 4):
        costed = [op for op in zoo_graph("lenet", batch_size=batch_size).ops if op.forward_flops > 0]
        assert costed
        missing = [
            op.name
            for op in costed
            if lenet_table.lookup("CPU", op.op_type, op.output_shapes[0], op.param_bytes) is None
        ]
        assert not missing, (batch_size, missing)


def test_table_round_trips_through_json(lenet_table: ProfileTable, tmp_path: Path) -> None:
    path = tmp_path / "lenet_profile.json"
    lenet_table.to_json(path)
    assert ProfileTable.from_json(path) == lenet_table


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(UnknownNameError, match="unknown model 'lenet9000'"):
        profile_models(["lenet9000"], progress=False)
    with pytest.raises(ValueError, match="batch split 3 does not divide the batch size 8"):
        profile_models(["lenet"], batch_size=8, batch_splits=(1, 3), progress=False)
    with pytest.raises(UnknownNameError, match="option of model 'lenet' 'colour'"):
        profile_models(["lenet"], batch_size=8, options={"lenet": {"colour": "red"}}, progress=False)


def test_functions_methods_and_tied_weights_match_the_importer(zoo_graph: Callable[..., OpGraph]) -> None:
    """BERT: explicit matmuls, softmax and adds, buffers, and a decoder tied to the word embedding."""
    options = {"num_layers": 1, "hidden": 32, "heads": 2, "seq_len": 8, "vocab_size": 100}
    table = profile_models(["bert_small"], batch_size=2, repeats=1, progress=False, options={"bert_small": options})
    graph = zoo_graph("bert_small", batch_size=2, **options)
    costed = [op for op in graph.ops if op.forward_flops > 0]
    assert {"matmul", "softmax", "add", "layer_norm", "gelu", "cross_entropy"} <= {op.op_type for op in costed}
    for op in costed:
        assert table.lookup("CPU", op.op_type, op.output_shapes[0], op.param_bytes) is not None, op.name
    decoder = next(op for op in graph.ops if op.param_key == "decoder")
    assert decoder.param_bytes == 100 * 4  # the tied weight counts under the word embedding: bias only


def test_max_ops_per_model_stops_early() -> None:
    table = profile_models(["lenet"], batch_size=2, repeats=1, max_ops_per_model=2, progress=False)
    assert sorted(op_type for _, op_type, _, _ in table.entries) == ["conv2d", "relu"]
