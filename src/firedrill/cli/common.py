"""What every command module of the CLI shares: the exit codes, the default store, the consoles.

One ``ExitCode`` so that a code means the same thing in every command (scripts and CI branch on
it), and one default store URL so that ``respond --db``, ``incident``, ``gameday ladder`` and
``audit verify`` find the same file when none is named.
"""

from __future__ import annotations

import enum
from typing import Annotated

import typer
from rich.console import Console

from firedrill.settings import DEFAULT_DB_URL

__all__ = [
    "DEFAULT_DB_URL",
    "ExitCode",
    "PrometheusOption",
    "SpeedOption",
    "console",
    "err",
    "group",
]

# a live run's options, the same for a drill (gameday run) and a scenario (respond)
PrometheusOption = Annotated[
    str | None,
    typer.Option(
        "--prometheus",
        help="Live: read every signal from this Prometheus (URL) scraping --target.",
    ),
]
SpeedOption = Annotated[
    float | None,
    typer.Option(min=0.1, max=10_000, help="Live: the --target's speed (`twin serve --speed`; 1)."),
]


class ExitCode(enum.IntEnum):
    """The process exit codes of every ``firedrill`` command."""

    OK = 0
    FAILED = 1  # the run failed, or its expectations were not met
    USAGE = 2  # Click's usage error (bad option, missing argument)
    ABORTED = 3  # a drill aborted by one of its stop conditions
    INPUT = 4  # a spec or other input error: a clear message, nothing run
    REFUSED = 5  # a drill refused to start (steady state, ladder gate, unreverted leftovers)
    CANCELLED = 130  # the shell's code for a process ended by SIGINT (Ctrl-C)


console = Console()
err = Console(stderr=True)


def group(app: typer.Typer, name: str, help: str = "") -> typer.Typer:
    """The sub-app ``name`` of ``app`` (``firedrill NAME ...``), added on first use.

    Command modules call this instead of importing each other's sub-apps, so that any module may
    add a command to ``export`` or ``audit`` whatever order the modules register in.
    """
    for info in app.registered_groups:
        if info.name == name and info.typer_instance is not None:
            return info.typer_instance
    sub = typer.Typer(help=help, no_args_is_help=True)
    app.add_typer(sub, name=name)
    return sub
