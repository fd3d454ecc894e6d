"""Experiments: every method side by side on a set of instances, cell by cell (``placement-rl compare``).

An *experiment* names models (with batch sizes), topologies, methods with their budgets, and seeds.
It expands into *cells*, one per (instance, method, seed): an instance is a model on a topology, and
a method that takes no seed (the baselines, FT, a trained policy) gets one cell per instance. Each
cell is one :func:`~placement_rl.methods.compare_methods` call, so every row of every command has
the same format (:func:`cell_row`): the :class:`~placement_rl.methods.MethodResult` row (makespan,
speedup over each data-parallel reference, the compute lower bound and the headroom captured,
memory, communication, search seconds) plus the cell's model, topology, seed, status and plan file.

The experiment file (YAML, read at the Ray edge: :func:`placement_rl.rl.compare.load_experiment`)::

    name: flexflow-fig6                   # default: the file's stem
    models:                               # zoo names, graph .json files, model strings or mappings:
      - alexnet                           #   the paper's batch size
      - {model: resnet101, batch_per_device: 64}   # 64 samples per GPU of each topology
      - {model: rnnlm, batch_size: 64, options: {steps: 2}, coarsen: 4, label: rnnlm2-g4}
      - {model: "hf:LlamaForCausalLM:num_hidden_layers=4", batch_size: 16, options: {seq_len: 1024}, label: llama4}
    topologies: [flexflow-p100, "test:10", random:3, my_cluster.json]   # test:N / train:N: random splits
    methods:
      - data_parallel
      - {method: mcmc, budget: 30s, chains: 1}          # options are checked against the method's
      - {method: trinity, checkpoint: out/trinity/checkpoint_final, held_out: [vgg19]}
      - {method: tag, checkpoint: out/tag/checkpoint_final, optional: true}   # rows say it is missing
    seeds: [0, 1, 2]                      # or a count: 3
    cost: {optimizer: adam}               # CostModel options; profile / comm_table are file paths
    concurrency: 4                        # cells at once (default: the Ray cluster's CPUs)

Every key is checked when the file is read (:func:`parse_experiment`: an unknown key lists the valid
ones), and every name, budget and instance before any cell runs (:func:`prepare`): unknown methods,
models and topologies, bad budgets, exhaustive search on a space too large. Sizes are bounded: at
most :data:`MAX_SEEDS` seeds, :data:`MAX_CELLS` cells and a global batch of :data:`MAX_BATCH_SIZE`
(search budgets: :class:`placement_rl.search.Budget`). Learned methods (a
registered agent with a ``checkpoint``) are resolved at the Ray edge, which checks their agent kind
and held-out models first.

The driver (:func:`run_experiment`) runs the cells through an injected :class:`CellRunner` (serial
here; Ray tasks with bounded concurrency at the edge, :class:`placement_rl.rl.compare.RayCells`),
writes each finished cell's plan JSON and appends its row to ``results.jsonl`` at once, so that
``resume`` skips finished cells and nothing finished is lost on a crash or Ctrl-C. A damaged line of
``results.jsonl`` (cut short by a crash, or edited: :func:`row_problem`) is skipped with a warning
naming its line, and its cell runs again; the file is only ever appended to. Then it writes
``results.csv``, ``results.md``, ``summary.csv``/``summary.md`` and the PNGs (:func:`write_outputs`).
Rows are standard JSON: a figure with no finite value (a search's best cost before any plan fits) is
``null``. Where no method's plan fits in memory, the Markdown files say so and name the plan that
needs the least (:func:`no_fit`).

Modules: :mod:`.spec` (the file's records and checks), :mod:`.cells` (instances and cells),
:mod:`.running` (one cell), :mod:`.driver` (:func:`run_experiment`, ``results.jsonl``), :mod:`.reports`
(tables and summaries), :mod:`.plots` (PNGs).

Models: a zoo name or a graph ``.json`` file today. Model specs such as ``hf:...`` or
``package.module:factory`` join through :func:`load_model`, the one place a model string becomes a
graph.
"""

from placement_rl.experiments.cells import (
    Cell,
    Instance,
    Prepared,
    load_model,
    prepare,
    with_methods,
)
from placement_rl.experiments.driver import (
    MAX_DAMAGED_WARNINGS,
    Report,
    append_row,
    read_rows,
    row_problem,
    run_experiment,
)
from placement_rl.experiments.plots import (
    MAX_ANYTIME_FILES,
    MAX_ANYTIME_PANELS,
    MAX_BAR_INSTANCES,
    anytime_png,
    anytime_pngs,
    draw_anytime,
    speedup_png,
)
from placement_rl.experiments.reports import (
    csv_columns,
    csv_text,
    markdown_table,
    no_fit,
    no_fit_lines,
    reference_names,
    summarize,
    summary_markdown,
    write_outputs,
)
from placement_rl.experiments.running import (
    ROW_FIELDS,
    CellOutcome,
    CellRunner,
    Measured,
    MethodResolver,
    cell_row,
    execute_cell,
    held_out_note,
    measure_cell,
    measure_cells,
    plan_file_name,
    refused_note,
    resolve_registered,
    serial_cells,
)
from placement_rl.experiments.spec import (
    ANYTIME_DIR,
    ANYTIME_PNG,
    CSV_FILE,
    ENTRY_KEYS,
    EXPERIMENT_FILE,
    FINISHED,
    LEARNED_KEYS,
    MARKDOWN,
    MAX_BATCH_SIZE,
    MAX_CELLS,
    MAX_SEED,
    MAX_SEEDS,
    RESULTS,
    RUNTIME_OPTIONS,
    SPEEDUP_PNG,
    SUMMARY_CSV,
    SUMMARY_MD,
    TOP_KEYS,
    Experiment,
    MethodEntry,
    ModelEntry,
    build_cost_model,
    calibration_named,
    expand_topology,
    method_option_names,
    parse_experiment,
    parse_method_entry,
)

__all__ = [
    "ANYTIME_DIR",
    "ANYTIME_PNG",
    "CSV_FILE",
    "Cell",
    "CellOutcome",
    "CellRunner",
    "ENTRY_KEYS",
    "EXPERIMENT_FILE",
    "Experiment",
    "FINISHED",
    "Instance",
    "LEARNED_KEYS",
    "MARKDOWN",
    "MAX_ANYTIME_FILES",
    "MAX_ANYTIME_PANELS",
    "MAX_BAR_INSTANCES",
    "MAX_BATCH_SIZE",
    "MAX_CELLS",
    "MAX_DAMAGED_WARNINGS",
    "MAX_SEED",
    "MAX_SEEDS",
    "Measured",
    "MethodEntry",
    "MethodResolver",
    "ModelEntry",
    "Prepared",
    "RESULTS",
    "ROW_FIELDS",
    "RUNTIME_OPTIONS",
    "Report",
    "SPEEDUP_PNG",
    "SUMMARY_CSV",
    "SUMMARY_MD",
    "TOP_KEYS",
    "anytime_png",
    "anytime_pngs",
    "append_row",
    "build_cost_model",
    "calibration_named",
    "cell_row",
    "csv_columns",
    "csv_text",
    "draw_anytime",
    "execute_cell",
    "expand_topology",
    "held_out_note",
    "load_model",
    "markdown_table",
    "measure_cell",
    "measure_cells",
    "method_option_names",
    "no_fit",
    "no_fit_lines",
    "parse_experiment",
    "parse_method_entry",
    "plan_file_name",
    "refused_note",
    "prepare",
    "with_methods",
    "read_rows",
    "reference_names",
    "resolve_registered",
    "row_problem",
    "run_experiment",
    "serial_cells",
    "speedup_png",
    "summarize",
    "summary_markdown",
    "write_outputs",
]
