"""The plain PyTorch training iteration of a zoo model: what the executor's iteration is measured against.

:func:`measure_plain_iterations` builds the zoo module on the device (weights and all), draws the
batch as the profiler does (:func:`placement_rl.profiling._random_inputs`) and times whole training
steps: forward (the loss), backward, an SGD step, the device synchronized around each phase (as
``benchmarks/data/h200/measure_iterations.py`` did for the H200 measurements). Each figure is the median
over ``iterations`` steps after ``warmup`` unmeasured ones.

Precisions (the names of :data:`placement_rl.sim.cost.PRECISIONS`), as people train:

* ``fp32``: torch's default math: cuDNN may use TF32 for convolutions, cuBLAS matmuls in fp32
  (the H200 data's ``default`` mode);
* ``tf32``: TF32 for convolutions and matmuls;
* ``bf16-mixed`` / ``fp16-mixed``: the forward under ``torch.autocast`` in bf16 / fp16, TF32 on,
  fp32 weights and SGD step (fp16 without loss scaling: its time is a few elementwise kernels).

On the CPU the TF32 settings do nothing and autocast runs in the CPU's bf16 / fp16.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from placement_rl import zoo
from placement_rl.graph.importer import symbolic_trace

#: Each precision's label in the H200 data's ``mode`` column (``benchmarks/data/h200/README.md``).
MODES: dict[str, str] = {"fp32": "default", "tf32": "tf32", "bf16-mixed": "bf16", "fp16-mixed": "fp16"}

_AUTOCAST: dict[str, torch.dtype] = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


@dataclass(frozen=True)
class PlainIteration:
    """One model's plain training iteration at one batch size and precision (milliseconds: medians).

    Attributes:
        model: zoo model name.
        precision: a key of :data:`MODES`.
        batch: the batch the step ran.
        params: parameter count.
        forward_ms: the forward pass (the loss).
        fwd_bwd_ms: forward and backward.
        iteration_ms: forward, backward and the SGD step.
        min_iteration_ms: the fastest measured iteration.
        peak_mem_bytes: ``torch.cuda.max_memory_allocated`` over the steps, warm-ups too (0 on the CPU).
        loss: the last step's loss.
        iterations, warmup: measured and unmeasured steps.
        device: the torch device.
    """

    model: str
    precision: str
    batch: int
    params: int
    forward_ms: float
    fwd_bwd_ms: float
    iteration_ms: float
    min_iteration_ms: float
    peak_mem_bytes: int
    loss: float
    iterations: int
    warmup: int
    device: str

    @property
    def mode(self) -> str:
        return MODES[self.precision]

    def to_dict(self) -> dict[str, Any]:
        """A line of ``iterations.jsonl``: the H200 data's keys (``mode`` among them), and the others."""
        return {"model": self.model, "mode": self.mode, **{k: v for k, v in asdict(self).items() if k != "model"}}


def check_precision(precision: str) -> str:
    """``precision`` when it is a key of :data:`MODES`.

    Raises:
        ValueError: naming the precisions.
    """
    if precision not in MODES:
        raise ValueError(f"precision {precision!r}; expected one of {list(MODES)}")
    return precision


@contextlib.contextmanager
def math_mode(precision: str) -> Iterator[None]:
    """TF32 as ``precision`` trains (module docstring) while open; the flags are restored after."""
    check_precision(precision)
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    try:
        before = (matmul.allow_tf32, cudnn.allow_tf32)
    except RuntimeError:  # flags set through torch's newer fp32_precision API: restore torch's defaults
        before = (False, True)
    matmul.allow_tf32 = precision != "fp32"
    cudnn.allow_tf32 = True
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The forward's autocast for ``precision`` (disabled for fp32 and tf32)."""
    dtype = _AUTOCAST.get(check_precision(precision))
    if dtype is None:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=dtype)


def measure_plain_iterations(
    model: str,
    batch_sizes: Sequence[int | None] = (None,),
    precisions: Sequence[str] = ("fp32",),
    *,
    device: str | torch.device = "cpu",
    iterations: int = 10,
    warmup: int = 3,
    options: Mapping[str, Any] | None = None,
    seed: int = 0,
    lr: float = 1e-3,
) -> list[PlainIteration]:
    """Time plain training steps of zoo model ``model`` (module docstring), built once on ``device``.

    Args:
        model: zoo model name.
        batch_sizes: the batches to measure (``None``: the model's default batch).
        precisions: keys of :data:`MODES`; every batch is measured in each, precisions innermost.
        device: ``"cpu"`` or a CUDA device.
        iterations: measured steps (their medians are recorded), after ``warmup`` unmeasured ones.
        options: zoo architecture options.
        seed: of the weights and the batch.
        lr: the SGD step's learning rate.

    Returns:
        One :class:`PlainIteration` per ``(batch, precision)``, in that order.

    Raises:
        UnknownNameError, ValueError: a bad model, option, batch, precision or count.
        torch.cuda.OutOfMemoryError: a batch does not fit (the caller decides what to record).
    """
    for p in precisions:
        check_precision(p)
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations = {iterations!r}; expected a positive integer")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup = {warmup!r}; expected an integer >= 0")
    opts = dict(options or {})
    spec, _ = zoo.check(model, None, opts)
    batches = [zoo.check(model, b, opts)[1] for b in batch_sizes]
    dev = torch.device(device)
    from placement_rl.profiling import _random_inputs

    torch.manual_seed(seed)
    with torch.device(dev):
        module = spec.build(**opts)
    module.train()
    with torch.device("meta"):
        gm = symbolic_trace(spec.build(**opts))  # the placeholders the profiler's input rules read
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    params = sum(p.numel() for p in module.parameters())
    out = []
    for batch in batches:
        inputs = _random_inputs(gm, spec.example_inputs(batch, **opts), dev)
        for precision in precisions:
            phases, loss, peak = _time_steps(module, optimizer, inputs, precision, dev, iterations, warmup)
            fwd, fb, it = phases
            out.append(
                PlainIteration(
                    model,
                    precision,
                    batch,
                    params,
                    1e3 * statistics.median(fwd),
                    1e3 * statistics.median(fb),
                    1e3 * statistics.median(it),
                    1e3 * min(it),
                    peak,
                    loss,
                    iterations,
                    warmup,
                    str(dev),
                )
            )
        del inputs
    return out


def _time_steps(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: Sequence[torch.Tensor],
    precision: str,
    dev: torch.device,
    iterations: int,
    warmup: int,
) -> tuple[tuple[list[float], list[float], list[float]], float, int]:
    """``((forward_s, fwd_bwd_s, iteration_s) per measured step, last loss, peak bytes)``."""
    cuda = dev.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    fwd: list[float] = []
    fb: list[float] = []
    it: list[float] = []
    loss = torch.zeros(())
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    with math_mode(precision):
        for i in range(warmup + iterations):
            optimizer.zero_grad(set_to_none=True)
            sync()
            t0 = time.perf_counter()
            with autocast(precision, dev):
                loss = module(*inputs)
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            optimizer.step()
            sync()
            t3 = time.perf_counter()
            if i >= warmup:
                fwd.append(t1 - t0)
                fb.append(t2 - t0)
                it.append(t3 - t0)
    peak = int(torch.cuda.max_memory_allocated(dev)) if cuda else 0
    return (fwd, fb, it), float(loss.detach()), peak
