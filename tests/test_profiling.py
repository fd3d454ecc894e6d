"""Op profiling: entries for every costed op of a zoo graph, at the full batch and its partitions."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from placement_rl import zoo
from placement_rl.errors import UnknownNameError
from placement_rl.graph import Op
from placement_rl.profiling import profile_models
from placement_rl.sim.cost import ProfileTable


@pytest.fixture(scope="module")
def lenet_table() -> Iterator[ProfileTable]:
    """LeNet at batch 8 and its 2-way partitions (batch 4), profiled once for the module.

    Single-threaded: on small shared VMs, waking the second intra-op thread can stall an op for
    milliseconds, far longer than LeNet's ops take, which would make the batch-size comparison flaky.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield profile_models(["lenet"], batch_size=8, batch_splits=(1, 2), repeats=2, progress=False)
    finally:
        torch.set_num_threads(threads)


def _first_conv(batch_size: int) -> Op:
    return next(op for op in zoo.load("lenet", batch_size=batch_size).ops if op.op_type == "conv2d")


def test_entries_cover_the_batch_and_its_partitions(lenet_table: ProfileTable) -> None:
    assert lenet_table.device.startswith("CPU")
    assert {key[0] for key in lenet_table.entries} == {"CPU"}
    full, half = _first_conv(8), _first_conv(4)
    assert full.output_shapes[0] == (8, 6, 28, 28) and half.output_shapes[0] == (4, 6, 28, 28)
    full_entry = lenet_table.lookup("CPU", "conv2d", full.output_shapes[0], full.param_bytes)
    half_entry = lenet_table.lookup("CPU", "conv2d", half.output_shapes[0], half.param_bytes)
    assert full_entry is not None and half_entry is not None
    for entry in lenet_table.entries.values():
        for seconds in (entry.forward_s, entry.backward_s):
            assert math.isfinite(seconds) and seconds >= 0
    assert full_entry.forward_s > 0
    assert full_entry.forward_s >= 0.2 * half_entry.forward_s  # twice the work: never much faster


def test_every_costed_op_finds_an_entry(lenet_table: ProfileTable) -> None:
    for batch_size in (8, 4):
        costed = [op for op in zoo.load("lenet", batch_size=batch_size).ops if op.forward_flops > 0]
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


def test_functions_methods_and_tied_weights_match_the_importer() -> None:
    """BERT: explicit matmuls, softmax and adds, buffers, and a decoder tied to the word embedding."""
    options = {"num_layers": 1, "hidden": 32, "heads": 2, "seq_len": 8, "vocab_size": 100}
    table = profile_models(["bert_small"], batch_size=2, repeats=1, progress=False, options={"bert_small": options})
    graph = zoo.load("bert_small", batch_size=2, **options)
    costed = [op for op in graph.ops if op.forward_flops > 0]
    assert {"matmul", "softmax", "add", "layer_norm", "gelu", "cross_entropy"} <= {op.op_type for op in costed}
    for op in costed:
        assert table.lookup("CPU", op.op_type, op.output_shapes[0], op.param_bytes) is not None, op.name
    decoder = next(op for op in graph.ops if op.param_key == "decoder")
    assert decoder.param_bytes == 100 * 4  # the tied weight counts under the word embedding: bias only


def test_max_ops_per_model_stops_early() -> None:
    table = profile_models(["lenet"], batch_size=2, repeats=1, max_ops_per_model=2, progress=False)
    assert sorted(op_type for _, op_type, _, _ in table.entries) == ["conv2d", "relu"]
