"""The documentation site (mkdocs.yml, docs/) and the README agree with the code.

- Every generated table of docs/ is what its command prints now (``benchmarks/docs_tables.py``
  renders it again here); the cheap ones run in the fast subset, the others are marked ``slow``.
  A table of a command that takes a minute or more (``Table.slow``) is not re-run here: its region and
  command must be on its page, and ``python benchmarks/docs_tables.py --slow`` rewrites it.
- Every page of the nav exists and every page is in the nav; the README links to pages that exist.
- The README's two commands and its Python example appear on the getting-started page as they are.

Every docs page's commands are parsed (and the quick ones run) by tests/test_readme_commands.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: Pages under docs/ that are not part of the site (a benchmark's output; mkdocs.yml excludes it).
NOT_PAGES = ("anytime/results.md",)


def _load_tables() -> ModuleType:
    return load_script("benchmarks/docs_tables.py", "docs_tables")


TABLES = _load_tables()


@pytest.fixture(scope="module")
def tables() -> ModuleType:
    return TABLES


class _Loader(yaml.SafeLoader):
    """mkdocs.yml's loader: ``!!python/name:...`` tags (Markdown extension options) read as their name."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda loader, suffix, node: suffix)


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    raise AssertionError(f"unexpected nav entry {nav!r}")


def test_the_nav_and_the_pages_agree() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)
    assert config["docs_dir"] == "docs" and config["theme"]["name"] == "material"
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    missing = [page for page in nav if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")} - set(NOT_PAGES)
    assert pages == set(nav), f"pages not in the nav: {sorted(pages - set(nav))}"
    assert {"architecture.md", "formats.md"} <= set(nav)


def test_every_generated_region_has_a_table_and_shows_its_command(tables: ModuleType) -> None:
    regions = tables.page_regions()
    assert set(regions) == set(tables.TABLES), "a generated region without a table, or a table without a region"
    for name, table in tables.TABLES.items():
        page, _ = regions[name]
        assert page == table.page, f"region {name!r} is in docs/{page}, its table says docs/{table.page}"
        text = re.sub(r"\s+", " ", (DOCS / page).read_text(encoding="utf-8"))
        assert table.command in text, f"docs/{page} does not show the command of its {name!r} table"


def test_a_region_is_replaced_and_nothing_else(tables: ModuleType) -> None:
    end = "<!-- end generated -->\n"
    text = f"a\n<!-- generated: x -->\nold\n{end}b\n<!-- generated: y -->\nkeep\n{end}"
    new = tables.replace(text, "x", "| new |\n")
    assert tables.regions(new) == {"x": "| new |\n", "y": "keep\n"}
    assert new.startswith("a\n") and "\nb\n" in new


@pytest.mark.parametrize("name", [name for name, table in TABLES.TABLES.items() if not table.slow])
def test_generated_table_matches_its_command(name: str, tables: ModuleType) -> None:
    page, content = tables.page_regions()[name]
    rendered = tables.render(name)
    assert content == rendered, (
        f"docs/{page}'s generated table {name!r} differs from what its command prints now; run "
        f"`python benchmarks/docs_tables.py {name}` and check the page's prose:\n{rendered}"
    )


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_getting_started_shows_the_readmes_commands_and_example() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    page = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    commands = [block for block in _bash_blocks(readme) if "pip install" in block]
    assert len(commands) == 2, "the README shows the install-and-run command and the test command"
    for block in commands:
        assert block in _bash_blocks(page), f"docs/getting-started.md does not show the README's {block!r}"
    example = re.search(r"^## What is here\n(.*?)(?=^## )", readme, flags=re.MULTILINE | re.DOTALL)
    assert example, "README.md has no '## What is here' section"
    assert _python_blocks(example.group(1))[0] in _python_blocks(page), "the Python example differs"


def test_the_readme_is_a_front_page_whose_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\((?!https?://)([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert sum(link.startswith("docs/") for link in links) >= 10, "the README links to the docs pages"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
    assert "mkdocs serve" in readme
