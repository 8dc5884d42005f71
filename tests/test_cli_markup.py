"""User text is never read as Rich markup: brackets in paths, ids and values print as written.

Rich treats ``[word]`` as a style and ``[/word]`` as its end; a stray closing tag is a
``MarkupError`` (a traceback, exit 1) and a matched pair silently vanishes from the output. The
text here comes from the user (paths, ids, store URLs) or from what they wrote (spec values,
stored incidents), so every command must print it literally.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from firedrill.cli import app

runner = CliRunner()
STRAY = "d[/oops]"  # a closing tag that matches nothing: MarkupError when read as markup
PAIR = "x[bold]y[/bold]"  # a pair: silently stripped when read as markup


def _commands(where: Path) -> dict[str, list[str]]:
    missing = str(where / "spec.yaml")
    db = str(where / "store.db")
    return {
        "twin run": ["twin", "run", missing, "--out", str(where / "out")],
        "twin serve": ["twin", "serve", missing],
        "rules generate": ["rules", "generate", missing, "--out", str(where / "rules")],
        "rules check": ["rules", "check", str(where)],
        "alerting compare": ["alerting", "compare", missing],
        "respond": ["respond", missing],
        "export nhc": ["export", "nhc", missing],
        "export chaos-mesh": ["export", "chaos-mesh", missing],
        "export fis": ["export", "fis", missing],
        "export evidence": ["export", "evidence", missing, "--out", str(where / "ev")],
        "audit verify": ["audit", "verify", "--db", f"sqlite:///{db}"],
        "audit evidence": ["audit", "evidence", str(where / "nothing")],
        "incident list": ["incident", "list", "--db", db],
        "incident show": ["incident", "show", "INC-1", "--db", db],
        "gameday plan": ["gameday", "plan", missing],
        "gameday run": ["gameday", "run", missing],
        "gameday ladder": ["gameday", "ladder", "--db", f"sqlite:///{db}"],
    }


@pytest.mark.parametrize("name", sorted(_commands(Path("/x"))))
@pytest.mark.parametrize("weird", [STRAY, PAIR])
def test_brackets_in_user_text_print_literally(tmp_path: Path, name: str, weird: str) -> None:
    where = tmp_path / weird
    where.mkdir(parents=True)  # "d[/oops]" is two directories, "d[" and "oops]"
    result = runner.invoke(app, _commands(where)[name])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{name} crashed: {result.exception!r}"
    )
    assert result.exit_code not in (0, 1), result.output  # refused as bad input, not crashed
    flat = result.output.replace("\n", "")
    assert weird in flat, f"{name}: the brackets were not printed as written:\n{result.output}"


def test_bracketed_spec_values_print_literally_in_the_plan(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parents[1] / "examples"
    drill = (examples / "drills" / "l3-cell-drain.yaml").read_text()
    for name in ("fleet.yaml", "slo.yaml", "policy.yaml"):
        (tmp_path / name).write_text((examples / name).read_text())
    marker = "hold [/steady] and [bold]loud[/bold]"
    clause = "clause: us-east-1 TTFT p99 stays under 2 s"
    assert drill.count(clause) == 1
    text = drill.replace(clause, f'clause: "{marker}"').replace("../", "")
    path = tmp_path / "drill.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["gameday", "plan", str(path)], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert marker in result.output
