"""The one loader of users' YAML files (experiments, training configs, ``--set`` values).

PyYAML's safe loader (plain data only: no Python objects), with what it lets through refused:

* documents whose aliases (``*name``) expand past :data:`MAX_YAML_NODES` nodes: a 1 KB "billion
  laughs" file of nested anchors expands to billions of nodes, and every later step that walks it
  (checks, error messages quoting a value, digests) would take minutes and gigabytes;
* recursive aliases (a node that contains itself);
* documents nested past :data:`MAX_YAML_DEPTH` levels;
* a mapping that gives a key twice (PyYAML keeps the last value silently).

Errors are :class:`~placement_rl.errors.SchemaError` (a ``ValueError``) naming the file.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from placement_rl.errors import SchemaError

#: The most nodes a YAML document may hold once its aliases are expanded (each alias counts the
#: nodes it stands for): far above any experiment or training file, far below a "billion laughs".
MAX_YAML_NODES = 1_000_000
#: The deepest a YAML document may nest (experiment files nest about 5 levels).
MAX_YAML_DEPTH = 100


def _check_yaml_nodes(root: yaml.Node, where: str) -> None:
    """Refuse a composed YAML document whose alias expansion exceeds :data:`MAX_YAML_NODES` nodes or
    :data:`MAX_YAML_DEPTH` levels, or that refers to itself (a recursive alias).

    Aliases are shared node objects, so the expanded size is computed once per distinct node
    (``size(node) = 1 + sum(size(child))``), iteratively: the check itself neither recurses nor expands.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
            if not children_done:
                _check_unique_keys(node, where)
        else:
            children = []
        if children_done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[key] > MAX_YAML_NODES:
                raise SchemaError(
                    f"{where}: the YAML document expands to more than {MAX_YAML_NODES:,} nodes through its "
                    "aliases (*name); expected a plain document (an alias-expansion bomb is refused)"
                )
            if depth[key] > MAX_YAML_DEPTH:
                raise SchemaError(f"{where}: YAML nested more than {MAX_YAML_DEPTH} levels deep")
            continue
        if key in size:
            continue
        if key in on_path:
            raise SchemaError(f"{where}: a YAML alias refers to a node that contains it; expected no recursive alias")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    return None


def _check_unique_keys(node: yaml.MappingNode, where: str) -> None:
    """Refuse a mapping that gives one key twice (PyYAML would keep the last value silently)."""
    seen: dict[tuple[str, str], int] = {}
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            key = (key_node.tag, key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise SchemaError(
                    f"{where}: line {line}: key {key_node.value!r} is given twice (first on line {seen[key]}); "
                    "expected each key once"
                )
            seen[key] = line


def loads_yaml(text: str, where: str) -> Any:
    """Parse YAML text with the safe loader (plain data only: no Python objects), refusing alias bombs,
    recursive aliases and documents nested too deeply (see the module docstring).

    Raises:
        SchemaError: naming ``where`` (and the position of a syntax error).
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_nodes(node, where)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise SchemaError(f"{where}: malformed YAML: {exc}") from None
    except RecursionError:
        raise SchemaError(f"{where}: YAML nested more than {MAX_YAML_DEPTH} levels deep") from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | os.PathLike[str]) -> Any:
    """Parse a user's YAML file with :func:`loads_yaml`; a missing file is a ``FileNotFoundError`` naming
    it, a folder or a file that is not UTF-8 a :class:`SchemaError`."""
    from placement_rl.io import read_user_text

    return loads_yaml(read_user_text(path, "YAML"), str(path))
