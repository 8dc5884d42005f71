"""``firedrill gameday run DRILL --runs N``: the drill N times with jitter, and the distributions.

Thin entry point over `firedrill.drill.many`: builds the executor (local processes by default,
or Ray: a local cluster, or the one at ``--ray-address``), cuts the runs into ensembles of
``--batch R`` runs (default `default_batch`: at least one ensemble per worker, at most 32 runs
each, and no more than half this machine's memory over all workers' ensembles; the summary is
the same whatever R), shows a progress bar counting finished runs, writes
the summary as JSON, Markdown and HTML (``drill.report.render_many_*``), prints the pass rate,
the RTO terms' p50/p95/p99 against the plan and the runs that did not pass with the command that
reruns each alone, and exits 0 when the pass rate reaches ``--min-pass-rate`` (default: every
run passed), 1 otherwise, 130 when cancelled with Ctrl-C.
"""

from __future__ import annotations

import enum
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from firedrill.cli.common import ExitCode, console, err
from firedrill.errors import FiredrillError
from firedrill.model.jsontypes import JsonObject

if TYPE_CHECKING:
    from firedrill.drill.many import Executor, RunOutcome

SHOWN_NOT_PASSED = 10  # runs that did not pass, listed on the terminal (all are in the JSON)
MAX_DEFAULT_BATCH = 32  # runs per ensemble when --batch is not given


MEMORY_SHARE = 0.5  # of this machine's memory, for all workers' ensembles together


def member_mb(nodes: int, hours: float) -> float:
    """A generous estimate of one ensemble member's peak memory (MB): its twin, recorded series
    and the run's control plane. Measured: the demo fleet (596 nodes) 12 MB for a 1-hour drill,
    the twin alone 7 MB per hour-long run and 27 MB over 6 h; the 10K fleet 75 MB over 1 h and
    679 MB over 24 h; so about 7 KB per node and hour (an overestimate for long runs) and 8 MB."""
    return 8.0 + 0.007 * nodes * max(hours, 0.0)


def default_batch(
    runs: int, workers: int, *, member: float | None = None, memory_mb: float | None = None
) -> int:
    """Runs per ensemble without ``--batch``: ``min(32, ceil(runs / workers))``, so that every
    worker gets at least one ensemble; with ``member`` (MB per member, `member_mb`) and the
    machine's ``memory_mb``, also no more than ``MEMORY_SHARE`` of the memory over all
    workers' ensembles (at least 1)."""
    batch = max(1, min(MAX_DEFAULT_BATCH, math.ceil(runs / max(1, workers))))
    if member is not None and memory_mb is not None and member > 0:
        fits = int(memory_mb * MEMORY_SHARE / max(1, workers) / member)
        batch = max(1, min(batch, fits))
    return batch


def machine_memory_mb() -> float | None:
    """This machine's physical memory in MB, where the system says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):
        return None


class ExecutorKind(enum.StrEnum):
    """Where the runs execute."""

    process = "process"
    ray = "ray"


def make_executor(kind: ExecutorKind, workers: int | None, ray_address: str | None) -> Executor:
    """The executor for ``--executor`` (Ray is imported only when asked for); one process
    worker runs in this process."""
    from firedrill.adapters.process_executor import ProcessExecutor
    from firedrill.drill.many import SerialExecutor

    if kind is ExecutorKind.ray:
        from firedrill.adapters.ray_executor import RayExecutor

        return RayExecutor(address=ray_address, workers=workers)
    if ray_address is not None:
        raise typer.BadParameter("--ray-address needs --executor ray", param_hint="--ray-address")
    return SerialExecutor() if workers == 1 else ProcessExecutor(workers)


def _secs(v: Any) -> str:
    if v is None:
        return "—"
    x = float(v)
    return f"{x:.1f} s" if x < 600 else f"{x / 60:.1f} min"


def _print_summary(summary: dict[str, Any], spec_path: str) -> None:
    from firedrill.drill.many import rerun_command

    v = summary["verdicts"]
    rate = summary["pass_rate"]
    colour = "green" if v["passed"] == summary["runs"] else "bold red"
    console.print(
        f"[{colour}]pass rate {rate:.1%}[/] over {summary['runs']} runs of "
        f"{escape(str(summary['drill']))} "
        f"(seed {summary['seed']}): {v['passed']} passed, {v['failed']} failed, "
        f"{v['aborted']} aborted" + (f", {v['refused']} refused" if v["refused"] else ""),
        highlight=False,
    )
    budget = summary.get("budget_s")
    t = Table(title=f"RTO terms over the runs (budget {_secs(budget)})", header_style="bold")
    for col in ("term", "plan", "p50", "p95", "p99", "measured in"):
        t.add_column(col)
    planned = summary.get("planned") or {}
    rows = [(k, d, planned.get(k)) for k, d in summary["terms"].items()]
    rows.append(("measured RTO", summary["measured"], budget))
    for key, d, plan in rows:
        p99 = d.get("p99")
        over = p99 is not None and plan is not None and p99 > plan
        t.add_row(
            key.removesuffix("_s").replace("_", " "),
            _secs(plan),
            _secs(d.get("p50")),
            _secs(d.get("p95")),
            ("[red]" if over else "") + _secs(p99),
            f"{d['n']} runs",
        )
    console.print(t)
    fired = [s for s in summary["stop_conditions"] if s["fired"]]
    if fired:
        console.print(
            "stop conditions fired: "
            + escape(", ".join(f"{s['name']} in {s['fired']} runs" for s in fired)),
            highlight=False,
        )
    bad = summary["not_passed"]
    if bad:
        t = Table(title=f"runs that did not pass ({len(bad)})", header_style="bold")
        for col in ("run", "verdict", "reason", "rerun alone"):
            t.add_column(col)
        for r in bad[:SHOWN_NOT_PASSED]:
            t.add_row(
                str(r["index"]),
                escape(str(r["verdict"])),
                escape(str(r["reason"])[:80]),
                escape(rerun_command(spec_path, r["seed"])),
            )
        console.print(t)
        if len(bad) > SHOWN_NOT_PASSED:
            console.print(f"… and {len(bad) - SHOWN_NOT_PASSED} more (every one in the JSON)")


def write_outputs(
    data: JsonObject,
    outputs: Sequence[tuple[Path | None, Callable[[JsonObject], str]]],
) -> list[Path]:
    """Write ``data`` through each (path, renderer) whose path is given; the paths written."""
    from firedrill.adapters import outputs as files

    written: list[Path] = []
    for path, render in outputs:
        if path is None:
            continue
        files.write(path, render(data))  # "-": stdout
        if not files.is_stdout(path):
            written.append(path)
    return written


def as_json(data: JsonObject) -> str:
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def _write(
    summary: JsonObject, *, json_out: Path | None, md_out: Path | None, html_out: Path | None
) -> list[Path]:
    from firedrill.drill.report import render_many_html, render_many_markdown

    return write_outputs(
        summary,
        [(json_out, as_json), (md_out, render_many_markdown), (html_out, render_many_html)],
    )


def run_sweep(
    loaded: Any,
    spec: Any,
    *,
    runs: int,
    seed: int,
    executor: ExecutorKind,
    workers: int | None,
    ray_address: str | None,
    batch: int | None = None,
    json_out: Path | None,
    md_out: Path | None,
    html_out: Path | None,
    out: Path | None,
    min_pass_rate: float,
    quiet: bool,
    target: str | None = None,
    db: str | None = None,
) -> ExitCode:
    """Run the sweep and report it; returns the exit code."""
    from firedrill.adapters.process_executor import usable_cpus
    from firedrill.adapters.worlds import EMBEDDED, EMBEDDED_ENSEMBLE
    from firedrill.drill.many import DrillJob, run_many

    if target is not None or db is not None:
        raise typer.BadParameter(
            "--runs sweeps the embedded twin; --target and --db are for a single run",
            param_hint="--runs",
        )
    if not 0.0 <= min_pass_rate <= 1.0:
        raise typer.BadParameter("a rate between 0 and 1", param_hint="--min-pass-rate")
    if batch is not None and batch < 1:
        raise typer.BadParameter(f"at least 1 run per ensemble (got {batch})", param_hint="--batch")
    ex = make_executor(executor, workers, ray_address)
    if batch is None:
        nodes = sum(p.nodes for r in loaded.fleet.regions for c in r.cells for p in c.node_pools)
        hours = (spec.duration_cap_s or 0.0) / 3600.0
        batch = default_batch(
            runs, workers or usable_cpus(), member=member_mb(nodes, hours),
            memory_mb=machine_memory_mb(),
        )  # fmt: skip
    job = DrillJob(
        spec, loaded.fleet, loaded.slo, loaded.policy, loaded.spec_sha256, make_world=EMBEDDED,
        make_ensemble=EMBEDDED_ENSEMBLE, batch=batch,
    )  # fmt: skip
    counts = {"passed": 0, "failed": 0, "aborted": 0, "refused": 0}
    where = ray_address or "local"
    n = workers or (min(usable_cpus(), runs) if executor is ExecutorKind.process else None)
    how = f"{executor.value}, " + ("every CPU of the cluster" if n is None else f"{n} worker")
    how += "s" if n is not None and n > 1 else ""
    how += f", {where}" if executor is ExecutorKind.ray else ""
    how += f", in ensembles of {batch}" if batch > 1 else ", one run at a time"
    wall0 = time.perf_counter()
    with Progress(
        TextColumn("[bold]gameday[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        disable=quiet,
        transient=True,
    ) as progress:
        task = progress.add_task(f"{spec.name} ({how})", total=runs)

        def done(o: RunOutcome) -> None:
            counts[o.verdict] = counts.get(o.verdict, 0) + 1
            text = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
            progress.update(task, advance=1, description=f"{spec.name} ({how}): {text}")

        try:
            summary = run_many(job, runs=runs, seed=seed, executor=ex, done=done)
        except KeyboardInterrupt:
            progress.stop()
            finished = sum(counts.values())
            err.print(
                f"[bold red]cancelled[/] after {finished} of {runs} runs; every worker stopped, "
                "nothing written",
                highlight=False,
            )
            return ExitCode.CANCELLED
        except FiredrillError as exc:
            progress.stop()
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
            return ExitCode.INPUT
    wall = time.perf_counter() - wall0
    summary["spec_path"] = str(loaded.path)
    if out is not None:
        json_out = json_out or out / "summary.json"
        md_out = md_out or out / "summary.md"
        html_out = html_out or out / "summary.html"
    try:
        written = _write(summary, json_out=json_out, md_out=md_out, html_out=html_out)
    except FiredrillError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return ExitCode.INPUT
    if not quiet:
        _print_summary(summary, str(loaded.path))
        for path in written:
            console.print(f"wrote [bold]{escape(str(path))}[/]")
        console.print(f"{runs} runs in {wall:.1f} s wall ({runs / wall:.2f} runs/s; {how})")
    return ExitCode.OK if summary["pass_rate"] >= min_pass_rate else ExitCode.FAILED
