"""Running ``promtool test rules`` from tests: one place for the files, the run and the verdict."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from firedrill.twin.exposition import promtool_test_file

PROMTOOL_TIMEOUT_S = 300
INSTALL_HINT = "install the Debian package prometheus (`make tools`)"


def promtool_binary() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.fail(f"promtool not found on PATH; {INSTALL_HINT}", pytrace=False)
    return found


def assert_promtool_agrees(
    directory: Path,
    rule_file: Mapping[str, Any],
    input_series: str,
    tests: Sequence[Mapping[str, Any]],
    *,
    interval_s: float,
) -> str:
    """Write the rule file and the unit test, run promtool, fail with its report on a mismatch."""
    (directory / "rules.yml").write_text(
        yaml.safe_dump(dict(rule_file), sort_keys=False, width=1000)
    )
    test_file = directory / "test.yml"
    test_file.write_text(
        promtool_test_file(
            input_series,
            rule_files=["rules.yml"],
            interval_s=interval_s,
            alert_rule_tests=list(tests),
            evaluation_interval_s=interval_s,
        )
    )
    result = subprocess.run(
        [promtool_binary(), "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        check=False,
    )
    # promtool pads its report with blank lines
    output = "\n".join(
        line for line in (result.stdout + result.stderr).splitlines() if line.strip()
    )
    assert result.returncode == 0, f"promtool disagrees with the evaluator:\n{output[-6000:]}"
    assert "SUCCESS" in output, output
    return output
