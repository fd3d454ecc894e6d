"""The importer is never silently wrong: the batch axis, leaf layers by isinstance, ops without a taxonomy
row, and modules whose training step fails. Tiny hand-written modules, both front ends."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from placement_rl import zoo
from placement_rl.graph import OpGraph, register_leaf
from placement_rl.graph.aten import ATEN_TYPES, ExportError, from_export
from placement_rl.graph.importer import check_training_step, from_torch
from placement_rl.graph.leaves import unregister_leaf
from placement_rl.ops import OP_KINDS

TRACERS = ("export", "fx")


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _sample_axes(graph: OpGraph) -> dict[str, int | None]:
    return {op.name: op.sample_dim.axis if op.sample_dim is not None else None for op in graph.ops}


def _quiet_import(module: nn.Module, inputs: tuple[torch.Tensor, ...], **kwargs: object) -> OpGraph:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no unknown-op warning either
        return from_torch(module, inputs, **kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the batch axis
class NumberedRows(nn.Module):
    """CLIP's contrastive loss in three ops: ``arange(len(x))`` makes export specialize the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x)
        idx = torch.arange(len(x), device=x.device)
        return x[idx].sum()


def test_batch_specialized_by_len_is_recovered_from_a_second_export() -> None:
    graph = from_export(NumberedRows(), (_meta(6, 8),))
    assert _sample_axes(graph) == {"x": 0, "lin": 0, "arange": 0, "index": 0, "sum_1": 0}
    (loss,) = [op for op in graph.ops if op.op_type == "sum"]
    assert loss.split == "sum" and loss.parallel_dims[0].reduction and loss.parallel_dims[0].size == 6
    # the source line that made the batch a constant is named
    assert "the constant 6 at" in graph.metadata["batch_specialized"]
    assert "torch.arange(len(x), device=x.device)" in graph.metadata["batch_specialized"]


class RowsPerSample(nn.Module):
    """A Python loop over the batch: the graph at batch B + 1 has one more op, so nothing is recovered."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        total = y[0].sum()
        for i in range(1, len(y)):  # the line that specializes the batch
            total = total + y[i].sum()
        return total


def test_batch_that_decides_the_graph_is_refused_naming_the_line() -> None:
    with pytest.raises(
        ExportError, match=r"the constant 3 at .*test_importer_edges.py:\d+: for i in range\(1, len\(y\)\)"
    ):
        from_export(RowsPerSample(), (_meta(3, 8),))
    # auto: export refuses, fx cannot trace len() either; the error says both
    with pytest.raises(ValueError, match=r"(?s)batch.*fx fallback was tried and failed too"):
        from_torch(RowsPerSample(), (_meta(3, 8),))


class FirstRows(nn.Module):
    """Indexes a constant number of rows: the batch is lost at the index, and what follows has none."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.rows = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = torch.arange(self.rows, device=x.device)
        return self.lin(x)[idx].relu().sum()


@pytest.mark.parametrize("tracer", TRACERS)
def test_an_op_that_loses_the_batch_is_refused(tracer: str) -> None:
    pattern = r"op 'getitem' \(slice" if tracer == "fx" else r"op 'index' \(gather\).*test_importer_edges.py:\d+"
    with pytest.raises(ValueError, match=rf"{pattern}.*the batch dimension is lost there"):
        from_torch(FirstRows(), (_meta(6, 8),), tracer=tracer)


def test_a_batch_of_one_keeps_its_sample_dimensions() -> None:
    # torch.export specializes sizes 0 and 1: the module is exported at batch 2 and evaluated at 1
    graph = from_export(nn.Sequential(nn.Linear(8, 4), nn.ReLU()), (_meta(1, 8),))
    assert [op.output_shapes for op in graph.ops] == [((1, 8),), ((1, 4),), ((1, 4),)]
    assert set(_sample_axes(graph).values()) == {0}
    assert graph.batch_size == 1 and "batch_specialized" not in graph.metadata


class Gram(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return (y.t() @ y).sum()


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_product_that_contracts_the_batch_is_a_partial_sum(tracer: str) -> None:
    graph = from_torch(Gram(), (_meta(6, 8),), tracer=tracer)
    (gram,) = [op for op in graph.ops if op.op_type == "matmul"]
    assert gram.split == "sum" and gram.output_shapes == ((4, 4),)
    assert gram.parallel_dims[0].reduction and gram.parallel_dims[0].size == 6


# ------------------------------------------------------------------ leaves by isinstance
class FalconLinear(nn.Linear):
    """Falcon's linear layer: a subclass of nn.Linear with a forward of its own."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out = input @ self.weight.T
        return out if self.bias is None else out + self.bias


class FalconMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = FalconLinear(8, 16)
        self.down = FalconLinear(16, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x))).sum()


@pytest.mark.parametrize("tracer", TRACERS)
def test_subclasses_of_leaf_layers_are_leaves(tracer: str) -> None:
    graph = _quiet_import(FalconMlp(), (_meta(3, 5, 8),), tracer=tracer)
    assert [op.op_type for op in graph.ops] == ["input", "linear", "gelu", "linear", "sum"]
    up, down = (op for op in graph.ops if op.op_type == "linear")
    assert (up.param_key, up.param_bytes, down.param_bytes) == ("up", (8 * 16 + 16) * 4, 16 * 4 * 4)
    # the weight is split like nn.Linear's: its output features are a parameter dimension, its input
    # features a reduction (the row-parallel split)
    assert [(d.name, d.kind) for d in up.parallel_dims] == [
        ("sample", "sample"),
        ("length", "attribute"),
        ("channel", "parameter"),
        ("in_channel", "parameter"),
    ]
    assert up.forward_flops >= 2 * 15 * 8 * 16


class Squash(nn.Module):
    """A layer of one's own: x * rsqrt(mean(x^2)) * w, which no built-in table knows."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class SquashNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = Squash(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.lin(x)).sum()


@pytest.fixture
def squash_leaf() -> Iterator[None]:
    register_leaf(Squash, "rms_norm")
    yield
    unregister_leaf(Squash)


@pytest.mark.parametrize("tracer", TRACERS)
def test_registered_leaves_are_one_op(tracer: str, squash_leaf: None) -> None:
    graph = _quiet_import(SquashNet(), (_meta(4, 8),), tracer=tracer)
    assert [op.op_type for op in graph.ops] == ["input", "linear", "rms_norm", "sum"]
    (norm,) = [op for op in graph.ops if op.op_type == "rms_norm"]
    assert norm.param_key == "norm" and norm.param_bytes == 8 * 4


def test_register_leaf_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"op_type = 'rmsnorm'; expected an op type of placement_rl.ops.OP_KINDS"):
        register_leaf(Squash, "rmsnorm")
    with pytest.raises(ValueError, match=r"module_cls = <class 'int'>; expected a torch.nn.Module subclass"):
        register_leaf(int, "linear")


# ------------------------------------------------------------------ ops without a taxonomy row
def test_the_aten_ops_that_were_other_have_rows() -> None:
    names = ("numpy_T", "softplus", "sign", "ceil", "detach_", "copy_", "scatter_", "linalg_vector_norm", "log_sigmoid")
    assert all(ATEN_TYPES[name] in OP_KINDS for name in names)
    assert OP_KINDS[ATEN_TYPES["numpy_T"]].family == "view" and OP_KINDS[ATEN_TYPES["detach_"]].family == "view"
    assert OP_KINDS[ATEN_TYPES["copy_"]].family == "copy"
    assert OP_KINDS["vector_norm"].reduces


class Pointwise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.softplus(x) + F.logsigmoid(x) + torch.sign(x) + torch.ceil(x)
        return torch.linalg.vector_norm(y, dim=-1).sum()


def test_new_rows_have_their_flop_rules_under_fx() -> None:
    graph = _quiet_import(Pointwise(), (_meta(2, 5),), tracer="fx")
    flops = {op.op_type: op.forward_flops for op in graph.ops}
    # per element of the (2, 5) input: softplus 3, log-sigmoid 4, sign 1, ceil 1; the norm 2 per input element
    assert (flops["softplus"], flops["log_sigmoid"], flops["sign"], flops["round"]) == (30, 40, 10, 10)
    assert flops["vector_norm"] == 20
    (norm,) = [op for op in graph.ops if op.op_type == "vector_norm"]
    assert norm.output_shapes == ((2,),) and norm.sample_dim is not None


def test_new_rows_are_known_to_export() -> None:
    graph = _quiet_import(Pointwise(), (_meta(2, 5),), tracer="export")
    assert {"softplus", "log_sigmoid", "sign", "round", "vector_norm"} <= {op.op_type for op in graph.ops}
    assert graph.metadata["unknown_ops"] == [] and graph.metadata["unknown_aten_ops"] == []


class ErfTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.erf(torch.erf(self.lin(x))).sum()  # erf has no row in the taxonomy


@pytest.mark.parametrize("tracer", TRACERS)
def test_unknown_ops_are_reported_once_with_count_and_flop_share(tracer: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = from_torch(ErfTwice(), (_meta(4, 10),), tracer=tracer)
    messages = [str(w.message) for w in caught if "no FLOP formula" in str(w.message)]
    assert len(messages) == 1
    (row,) = graph.metadata["unknown_ops"]
    total = sum(op.forward_flops for op in graph.ops)
    assert row["op_type"] == "erf" and row["count"] == 2
    assert row["forward_flops"] == 2 * 8 * 40 and row["flop_share"] == pytest.approx(640 / total)
    assert f"erf (x2, {100 * 640 / total:.3g}% of forward FLOPs)" in messages[0]
    assert caught[0].filename == __file__  # the warning points at the caller's line


# ------------------------------------------------------------------ the training step
class InPlaceOnSaved(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.lin(x))
        y.add_(1)  # sigmoid's backward needs y
        return y.sum()


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_module_whose_backward_fails_is_refused(tracer: str) -> None:
    with torch.device("meta"):
        module = InPlaceOnSaved()
    pattern = r"fails in its backward pass.*modified by an inplace operation.*SigmoidBackward0.*torch.sigmoid"
    with pytest.raises(ValueError, match=pattern):
        from_torch(module, (_meta(6, 8),), tracer=tracer)
    graph = from_torch(module, (_meta(6, 8),), tracer=tracer, check_backward=False)
    assert "backward_check" not in graph.metadata
    # nothing was allocated or stored on the module
    assert all(p.device.type == "meta" and p.grad is None for p in module.parameters())


def test_an_in_place_op_on_a_parameter_fails_in_the_forward_pass() -> None:
    class ScaleWeight(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.lin.weight.mul_(0.5)  # a leaf that requires grad, modified in place
            return self.lin(x).sum()

    with pytest.raises(ValueError, match=r"fails in its forward pass once autograd records it.*leaf Variable"):
        check_training_step(ScaleWeight(), (_meta(2, 8),))


def test_valid_modules_pass_whatever_their_output() -> None:
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> dict[str, object]:
            y = self.lin(x)
            return {"logits": y, "extra": (y.relu(), y.argmax(-1)), "note": "text"}

    module = Pair().train(False)
    assert check_training_step(module, (_meta(2, 8),)) == "passed"
    assert module.training is False  # it ran in training mode and got its mode back
    assert all(p.device.type == "cpu" and p.grad is None for p in module.parameters())  # and stored nothing
    no_params = nn.Sequential(nn.ReLU(), nn.Softmax(-1))
    assert check_training_step(no_params, (_meta(2, 8),)) == "passed"  # differentiated by its input
    assert check_training_step(nn.Identity(), (_meta(2, 8, dtype=torch.long),)).startswith("skipped")
    graph = from_torch(NumberedRows(), (_meta(6, 8),))
    assert graph.metadata["backward_check"] == "passed"


@pytest.mark.slow  # about 6 s: every zoo model, shrunk
@pytest.mark.parametrize("name", zoo.names())
def test_every_zoo_model_passes_the_training_step_check(name: str) -> None:
    spec = zoo.spec(name)
    options = {k: min(v, spec.options[k]) for k, v in {"steps": 3, "num_layers": 2}.items() if k in spec.options}
    module, inputs = zoo.build_module(name, batch_size=2, **options)
    assert check_training_step(module, inputs) == "passed"
