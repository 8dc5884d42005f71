"""Run the real Prometheus and Alertmanager tools on generated artefacts.

``promtool`` and ``amtool`` are external programs: this adapter runs them, maps their failures to
``ToolError`` (with the tool's own output), and never lets a missing binary look like success.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from firedrill.errors import FiredrillError


class ToolError(FiredrillError):
    """An external tool is missing, failed to run, or rejected its input."""


@dataclass(frozen=True)
class ToolResult:
    tool: str
    args: tuple[str, ...]
    ok: bool
    output: str


def find(tool: str) -> str:
    """Path of ``tool`` (``FIREDRILL_<TOOL>`` overrides), or a ToolError naming the package."""
    override = os.environ.get(f"FIREDRILL_{tool.upper().replace('-', '_')}")
    path = override or shutil.which(tool)
    if not path:
        raise ToolError(
            f"'{tool}' not found: install Debian's prometheus and prometheus-alertmanager "
            "packages (make tools)"
        )
    return path


def run(tool: str, *args: str, timeout_s: float = 300.0) -> ToolResult:
    exe = find(tool)
    try:
        proc = subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(f"{tool} {' '.join(args)}: {exc}") from exc
    return ToolResult(tool, tuple(args), proc.returncode == 0, proc.stdout + proc.stderr)


def check_rules(path: Path) -> ToolResult:
    return run("promtool", "check", "rules", str(path))


def check_alertmanager(path: Path) -> ToolResult:
    return run("amtool", "check-config", str(path))


def run_rule_tests(path: Path) -> ToolResult:
    return run("promtool", "test", "rules", str(path))
