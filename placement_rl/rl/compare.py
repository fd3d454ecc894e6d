"""``placement-rl compare``: an experiment's cells as Ray tasks, and the library call behind the command.

The core (:mod:`placement_rl.experiments`) reads no YAML and imports no Ray: it checks an experiment,
expands it into cells, formats rows and writes the outputs, running the cells through an injected
runner. This module adds what needs the edge:

* :func:`load_experiment`: the YAML file -> :class:`~placement_rl.experiments.Experiment` (the
  registered agents known, so a method with a ``checkpoint`` is checked against them);
* :func:`check_learned`: each learned method's checkpoints hold a policy of its agent, and none was
  trained on a model the entry holds out; checked before any cell runs;
* :func:`resolve_method`: the method a cell runs, a trained policy included (loaded once per worker);
* :class:`RayCells`: one Ray task per cell (1 CPU each), at most ``max_concurrent`` in flight, results
  yielded as they finish, pending tasks cancelled when the driver stops;
* :func:`compare`: all of it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from placement_rl.errors import SchemaError
from placement_rl.experiments import (
    CellRunner,
    Experiment,
    MethodEntry,
    Prepared,
    Report,
    parse_experiment,
    prepare,
    run_experiment,
)
from placement_rl.methods import Method, Problem, get_method


def load_experiment(path: str | Path, overrides: Sequence[str] = ()) -> Experiment:
    """Read and check an experiment YAML file (an empty file is an error naming it).

    Args:
        path: the file.
        overrides: ``KEY=VALUE`` settings applied first (:func:`apply_overrides`).
    """
    from placement_rl.rl.agents import agent_names
    from placement_rl.rl.config import read_yaml

    data = read_yaml(path)
    if data is None:
        raise SchemaError(f"{path}: the file is empty; expected the keys models, topologies and methods")
    data = apply_overrides(data, overrides, str(path))
    return parse_experiment(data, str(path), agents=agent_names(), name=Path(path).stem)


def apply_overrides(data: Any, overrides: Sequence[str], where: str = "experiment") -> Any:
    """An experiment document with ``KEY=VALUE`` settings applied (``VALUE`` read as YAML).

    ``KEY`` is a top-level key (``topologies=[test:5]``, ``seeds=1``) or ``methods.NAME.OPTION``
    (``methods.mcmc.budget=10s``), ``NAME`` being an entry's ``name`` or, when it has none, its
    method: a smaller run of a shipped experiment without editing the file.
    """
    import copy

    from placement_rl.experiments import TOP_KEYS
    from placement_rl.rl.yaml_files import loads_yaml

    if not overrides:
        return data
    if not isinstance(data, dict):
        return data  # parse_experiment says what is wrong
    doc = copy.deepcopy(data)
    for item in overrides:
        key, equals, text = item.partition("=")
        if not equals or not key:
            raise SchemaError(f"--set {item!r}; expected KEY=VALUE, e.g. methods.mcmc.budget=10s")
        value = loads_yaml(text, f"--set {item!r}")
        parts = key.split(".")
        if len(parts) == 1 and parts[0] in TOP_KEYS:
            doc[parts[0]] = value
            continue
        if len(parts) != 3 or parts[0] != "methods":
            raise SchemaError(f"--set {key!r}; expected one of {list(TOP_KEYS)} or methods.NAME.OPTION")
        entries = doc.get("methods") if isinstance(doc.get("methods"), list) else []
        names = []
        for k, entry in enumerate(entries):
            entry = {"method": entry} if isinstance(entry, str) else entry
            if isinstance(entry, dict):
                names.append(str(entry.get("name", entry.get("method"))))
                if names[-1] == parts[1]:
                    entries[k] = {**entry, parts[2]: value}
                    break
        else:
            raise SchemaError(f"--set {key!r}: {where} has no method named {parts[1]!r}; its methods are {names}")
    return doc


def training_models(env: dict[str, Any]) -> list[str]:
    """The zoo models a training config's generator drew from."""
    gen = env.get("generator") or {}
    if not isinstance(gen, dict):
        return ["inception_v3"]
    if gen.get("model"):
        return [gen["model"]]
    return list(gen.get("models", ["inception_v3"]))


def checkpoint_agent(checkpoint: str) -> tuple[str, list[str]]:
    """(agent name, zoo models its generator drew from) of the training run a checkpoint folder belongs to."""
    from placement_rl.io import read_json
    from placement_rl.rl.policy import run_config_path

    config = read_json(run_config_path(checkpoint))
    if not isinstance(config, dict):
        raise SchemaError(f"{checkpoint}: its run's train_config.json is not a mapping")
    env = config.get("env") if isinstance(config.get("env"), dict) else {}
    return str(config.get("agent", "trinity")), training_models(dict(env or {}))


def check_learned(prepared: Prepared, where: str = "experiment") -> None:
    """Check every learned method before any cell runs.

    Raises:
        SchemaError: for a checkpoint that is missing, holds a policy of another agent, has no safe
            policy export, or was trained on a model the entry holds out.
    """
    from placement_rl.rl.policy import with_env

    for j, entry in enumerate(prepared.experiment.methods):
        if entry.kind != "learned":
            continue
        label = f"{where}.methods[{j}] ({entry.name})"
        for model in dict.fromkeys(i.source for i in prepared.instances):
            path = entry.checkpoint_for(model)
            try:
                agent, trained_on = checkpoint_agent(path)
            except (ValueError, FileNotFoundError) as exc:
                raise SchemaError(f"{label}: checkpoint {path!r}: {exc}") from None
            if agent != entry.method:
                raise SchemaError(
                    f"{label}: checkpoint {path!r} holds a {agent!r} policy, not a {entry.method!r} one; "
                    f"expected a checkpoint of a {entry.method!r} training run"
                )
            seen = sorted(entry.held_out_for(model) & set(trained_on))
            if seen:
                raise SchemaError(
                    f"{label}: checkpoint {path!r} was trained on {seen}, which the entry holds out "
                    f"(held_out: {entry.to_dict()['held_out']}); expected a policy trained without them"
                )
            try:
                with_env(_policy(path), entry.env)
            except (ValueError, FileNotFoundError) as exc:
                raise SchemaError(f"{label}: checkpoint {path!r}: {exc}") from None


@functools.lru_cache(maxsize=16)
def _policy(checkpoint: str) -> Any:
    """A trained policy, loaded once per process (the driver's check, each Ray worker's cells)."""
    from placement_rl.rl.policy import load_policy

    return load_policy(checkpoint)


def _with_task_map(run: Callable[[Problem], Any], problem: Problem) -> Any:
    """Run a method whose chains go out as Ray tasks of their own (MCMC with ``chains`` > 1)."""
    from placement_rl.rl.parallel import RayMap

    return run(dataclasses.replace(problem, options={**problem.options, "task_map": RayMap()}))


def resolve_method(entry: MethodEntry, model: str) -> Method:
    """The :data:`~placement_rl.experiments.MethodResolver` of the edge: registered methods (MCMC's
    extra chains as Ray tasks) and trained policies (``checkpoint`` per model)."""
    from placement_rl.rl.policy import policy_method

    if entry.kind == "learned":
        return policy_method(_policy(entry.checkpoint_for(model)), entry.name, env=entry.env)
    method = get_method(entry.method)
    chains = entry.options.get("chains", 1)
    if isinstance(chains, int) and chains > 1 and "task_map" in method.options:
        return dataclasses.replace(method, run=functools.partial(_with_task_map, method.run))
    return method


class RayCells:
    """A :class:`~placement_rl.experiments.CellRunner` that runs every cell as a Ray task.

    At most ``max_concurrent`` tasks are in flight (default: the cluster's CPUs), each reserving
    ``num_cpus``, so the machine is never oversubscribed and a time-budgeted search gets its CPU to
    itself. Arguments that are the same object in several cells (an instance's graph and topology)
    go to the object store once. Results come back in the order the tasks finish; closing the
    iterator (the driver stopped, Ctrl-C) cancels the tasks still pending.

    Attributes:
        tasks: tasks submitted so far.
    """

    def __init__(self, max_concurrent: int | None = None, num_cpus: float = 1) -> None:
        self.max_concurrent = max_concurrent
        self.num_cpus = num_cpus
        self.tasks = 0

    def __call__(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]:
        import ray

        from placement_rl.rl.runtime import cluster_cpus, ensure_ray

        if not args:
            return
        ensure_ray()
        limit = max(1, self.max_concurrent or int(cluster_cpus() // max(self.num_cpus, 1)) or 1)
        shared: dict[int, Any] = {}

        def ref(value: Any) -> Any:
            if isinstance(value, (int, float, str, bool, type(None))) or callable(value):
                return value
            if id(value) not in shared:
                shared[id(value)] = ray.put(value)
            return shared[id(value)]

        remote = ray.remote(num_cpus=self.num_cpus, max_retries=0)(fn)
        pending: dict[Any, int] = {}
        queue = iter(enumerate(args))

        def submit() -> bool:
            item = next(queue, None)
            if item is None:
                return False
            k, call = item
            pending[remote.remote(*(ref(a) for a in call))] = k
            self.tasks += 1
            return True

        try:
            while len(pending) < limit and submit():
                pass
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for done in ready:
                    k = pending.pop(done)
                    try:
                        value = ray.get(done)
                    except ray.exceptions.RayError as exc:  # the worker died (e.g. killed for memory)
                        value = exc
                    submit()  # keep the cluster busy while the driver records this one
                    yield k, value
        finally:
            for left in pending:
                ray.cancel(left, force=True)


def check_chains(prepared: Prepared, cpus: int, where: str = "experiment") -> None:
    """Refuse MCMC entries whose chains cannot all run at once under a time budget (each chain would
    wait for a CPU and still get its full time)."""
    from placement_rl.search import Budget

    for j, entry in enumerate(prepared.experiment.methods):
        chains = entry.options.get("chains", 1)
        budget = entry.options.get("budget")
        if entry.kind == "registered" and isinstance(chains, int) and chains > 1 and budget is not None:
            if Budget.parse(budget).seconds is not None and chains > cpus:
                raise SchemaError(
                    f"{where}.methods[{j}] ({entry.name}): chains = {chains} with a time budget on a Ray cluster of "
                    f"{cpus} CPUs; expected chains <= {cpus}, or a budget in proposals"
                )


def default_out_dir(experiment: Experiment) -> Path:
    """``out/compare-<name>``."""
    from placement_rl.paths import safe_name

    return Path("out") / f"compare-{safe_name(experiment.name)}"


def compare(
    experiment: Experiment | str | Path,
    out_dir: str | Path | None = None,
    *,
    overrides: Sequence[str] = (),
    resume: bool = False,
    runner: CellRunner | None = None,
    concurrency: int | None = None,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> Report:
    """Run an experiment (a file or an :class:`Experiment`) and write its outputs.

    Every check runs before the first cell: the file's keys, the models, topologies, methods and
    their options on every instance, learned methods' checkpoints and held-out models, and (on Ray)
    MCMC chains against the cluster's CPUs.

    Args:
        experiment: an experiment YAML path or a parsed :class:`Experiment`.
        out_dir: the output folder (default ``out/compare-<name>``).
        overrides: ``KEY=VALUE`` settings for a file (:func:`apply_overrides`).
        resume: skip cells ``results.jsonl`` already has.
        runner: runs the cells (default :class:`RayCells` with ``concurrency``).
        concurrency: cells at once on Ray (default: the experiment's ``concurrency``, else the CPUs).
        progress: one progress bar over the cells.
        on_row: called with each new row.

    Returns:
        The :class:`~placement_rl.experiments.Report`.
    """
    if isinstance(experiment, Experiment):
        if overrides:
            raise ValueError("overrides apply to an experiment file; change the Experiment itself instead")
        exp, where = experiment, "experiment"
    else:
        exp, where = load_experiment(experiment, overrides), str(experiment)
    prepared = prepare(exp, where)
    check_learned(prepared, where)
    if runner is None:
        from placement_rl.rl.runtime import cluster_cpus

        check_chains(prepared, cluster_cpus(), where)
        runner = RayCells(concurrency or exp.concurrency)
    return run_experiment(
        prepared,
        out_dir or default_out_dir(exp),
        resume=resume,
        runner=runner,
        resolve=resolve_method,
        progress=progress,
        on_row=on_row,
    )
