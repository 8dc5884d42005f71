"""docs/twin.md's fidelity table stays true: every test it names exists and asserts its bound.

Each row names the test as ``path::function`` and quotes the bound as it is written in the
test's source (``rel=0.05``, ``51.84 + 15.0``...): a test renamed, removed or loosened without
the table changing fails here, and so does a table row that names no test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "twin.md"
HEADING = "### Fidelity checks"


def _rows() -> list[tuple[str, str, str]]:
    """(what, bound literal, path::test) per row of the table under the heading."""
    text = DOC.read_text(encoding="utf-8")
    assert HEADING in text, f"{DOC}: no '{HEADING}' section"
    section = text.split(HEADING, 1)[1].split("\n#", 1)[0]
    rows: list[tuple[str, str, str]] = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("what", "") or set(cells[0]) <= {"-", " "}:
            continue
        bound = re.findall(r"`([^`]+)`", cells[2])
        test = re.findall(r"`([^`]+::[^`]+)`", cells[4])
        assert bound, f"{DOC}: row '{cells[0]}' quotes no `bound`"
        assert test, f"{DOC}: row '{cells[0]}' names no `path::test`"
        rows.extend((cells[0], b, t) for b in bound for t in test)
    return rows


def _source_of(path: Path, name: str) -> str:
    src = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return "\n".join(src.splitlines()[first - 1 : node.end_lineno])
    raise AssertionError(f"{path}: no test named {name}")


def test_the_table_has_rows() -> None:
    assert len({t for _, _, t in _rows()}) >= 10


@pytest.mark.parametrize(("what", "bound", "test"), _rows())
def test_every_row_names_a_test_that_asserts_its_bound(what: str, bound: str, test: str) -> None:
    path, name = test.split("::")
    assert name.startswith("test_"), f"{what}: {name} is not a test"
    source = _source_of(ROOT / path, name)
    assert bound in source, f"{what}: {name} does not assert `{bound}`"
