"""The import rules of docs/architecture.md, checked on the source (every import, also inside functions)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Packages of placement_rl from the bottom layer up; a module may import only its own layer and below.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "io", "config", "progress", "parallel", "paths", "plots"),
    ("ops",),
    ("graph", "zoo", "models"),
    ("topology",),
    ("plan.core",),
    ("sim",),
    ("plan", "plan.constructors"),  # constructors may judge candidates by simulation (subset data parallelism)
    ("search", "profiling", "calibrate", "emulate", "execute"),
    ("methods", "explain", "experiments", "planted"),
    ("envs",),
    ("policies", "rl"),
    ("cli",),
]


def _layer_of(module: str) -> int:
    """The layer index of a dotted module name inside placement_rl (longest matching prefix)."""
    best, found = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), i
    if found < 0:
        raise AssertionError(f"module placement_rl.{module} is in no layer of docs/architecture.md")
    return found


def _modules() -> list[tuple[str, Path]]:
    """(module name inside placement_rl, path) of every source file, envs/ and policies/ included."""
    out = []
    for path in sorted((ROOT / "placement_rl").rglob("*.py")):
        rel = path.relative_to(ROOT / "placement_rl").with_suffix("")
        out.append((".".join(p for p in rel.parts if p != "__init__"), path))
    for pkg in ("envs", "policies"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            out.append((".".join(p for p in rel.parts if p != "__init__"), path))
    return out


def _imports(path: Path) -> list[tuple[str, int, str | None]]:
    """(imported module, line, enclosing function or None) of every import statement."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, int, str | None]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, function) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, child.lineno, function))
            visit(child, function)

    visit(tree, None)
    return found


def test_every_module_sits_in_a_layer() -> None:
    for module, _ in _modules():
        if module:  # placement_rl/__init__.py re-exports the public API
            _layer_of(module)


@pytest.mark.parametrize(("module", "path"), _modules(), ids=[m or "placement_rl" for m, _ in _modules()])
def test_imports_go_down_the_layers(module: str, path: Path) -> None:
    if not module:
        return  # placement_rl/__init__.py re-exports the public API
    mine = _layer_of(module)
    core = mine <= _layer_of("methods")
    for imported, line, function in _imports(path):
        top = imported.split(".")[0]
        if top in ("ray", "rllib"):
            allowed = mine >= _layer_of("rl") or (module == "envs.registry" and function == "register_rllib_envs")
            assert allowed, f"{path.name}:{line} imports {imported}: only the Ray edge (rl, policies) may"
        if imported.startswith("placement_rl."):
            target = imported[len("placement_rl.") :]
            theirs = _layer_of(target)
            assert theirs <= mine, (
                f"{path.name}:{line} (layer {LAYERS[mine]}) imports placement_rl.{target} "
                f"(layer {LAYERS[theirs]}), a layer above it"
            )
        if core and top in ("yaml", "tensorboardX"):
            raise AssertionError(f"{path.name}:{line}: the core reads no YAML and writes no TensorBoard ({imported})")


def test_importing_the_core_loads_no_ray() -> None:
    code = (
        "import sys, placement_rl, placement_rl.search, placement_rl.search.ft, placement_rl.methods, "
        "placement_rl.graph.coarsen, placement_rl.plan, placement_rl.zoo, placement_rl.envs;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'rllib')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"


def _runtime_edges() -> dict[str, set[str]]:
    """module -> the modules it imports when it runs (``if TYPE_CHECKING:`` blocks left out), with
    ``from package import submodule`` resolved to the submodule; inside placement_rl, envs, policies."""
    modules = {m: p for m, p in _modules() if m}

    def resolve(name: str) -> str | None:
        name = name[len("placement_rl.") :] if name.startswith("placement_rl.") else name
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        targets: set[str] = set()

        def visit(node: ast.AST, targets: set[str] = targets, module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                    names = [f"{child.module}.{a.name}" for a in child.names]
                else:
                    visit(child)
                    continue
                for name in names:
                    if name.split(".")[0] in ("placement_rl", "envs", "policies"):
                        target = resolve(name)
                        if target is not None and target != module:
                            targets.add(target)

        visit(tree)
        edges[module] = targets
    return edges


def test_no_import_circles() -> None:
    """No module reaches itself through the imports that run (a package's own ``__init__``
    re-exports aside: a submodule may import its siblings through the package)."""
    edges = _runtime_edges()
    packages = {m for m, p in _modules() if m and p.name == "__init__.py"}
    for package in packages:  # an __init__ that re-exports its submodules is not a circle with them
        edges[package] = {t for t in edges[package] if not t.startswith(package + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                circle = stack[stack.index(target) :] + [target]
                raise AssertionError(f"import circle: {' -> '.join(circle)}")
            if target not in state:
                walk(target)
        stack.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            walk(module)


def test_every_package_is_installed() -> None:
    """A package missing from pyproject.toml's list is absent from a non-editable install (CI's)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        "placement_rl." + ".".join(p.parent.relative_to(ROOT / "placement_rl").parts)
        if p.parent != ROOT / "placement_rl"
        else "placement_rl"
        for p in (ROOT / "placement_rl").rglob("__init__.py")
    }
    for pkg in ("envs", "policies"):
        found |= {
            ".".join(("placement_rl", *p.parent.relative_to(ROOT).parts)) for p in (ROOT / pkg).rglob("__init__.py")
        }
    assert found - listed == set(), f"packages missing from pyproject.toml [tool.setuptools] packages: {found - listed}"
