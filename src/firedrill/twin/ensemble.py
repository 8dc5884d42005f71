"""The twin's ensemble: R twins of one fleet stepped in lockstep, serving done once for all R.

A sweep's runs are independent, and on a fleet of a few dozen pools most of a twin's step is
fixed overhead: about a hundred small numpy operations that cost the same for 14 pools as for
14 × 32. ``TwinEnsemble`` keeps R twins (their own state, their own random generators) and
steps the ones whose runs asked for time together: each member's step up to serving (events,
reconcile, pulls), then the serving arithmetic of every member at once on arrays with a leading
run axis (``firedrill.twin.together``), then each member's step after serving (autoscaler,
faults, training, sandboxes, the scrape).

**Lockstep.** Each body (one run's control plane: detection, incidents, levers, stop
conditions, failover) runs in its own greenlet (a coroutine with its own stack, in this thread:
bodies never run at the same time): the body runs until its world's ``advance`` asks for time,
switches back, and is resumed only when its twin has reached the time it asked for. The
ensemble steps while every running body waits for time, and resumes the bodies whose time has
come one after the other, in member order. So a body's code
runs exactly as it would alone, on a twin whose every step is the single twin's step, and each
member's draws come from its own generators in the single run's order: member ``k`` is the
single run with the same fleet and seed, bit for bit (``tests/twin/test_ensemble.py`` holds it
to that over seeds). A body that returns drops out; an exception in one stops the others (their
``advance`` raises ``EnsembleStopped``, which the drill runner answers by reverting its
injections) and is raised.

A fleet with quiescent steps on is not stepped in lockstep (a quiet member takes macro steps of
its own): its members advance alone, one after the other, which gives the same results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from greenlet import getcurrent, greenlet

from firedrill.model.spec import FleetSpec
from firedrill.ports import DrillWorld
from firedrill.twin.engine import Twin
from firedrill.twin.together import ServeTogether
from firedrill.twin.world import TwinWorld

__all__ = ["EnsembleStopped", "EnsembleWorld", "TwinEnsemble", "embedded_ensemble"]

T = TypeVar("T")


class EnsembleStopped(BaseException):
    """Raised in a member's ``advance`` when another member failed or the ensemble was stopped."""


@dataclass(eq=False)
class _Member:
    index: int
    twin: Twin
    end_s: float | None = None  # the time its body waits for (None: its body is running)
    done: bool = False
    error: BaseException | None = None
    glet: Any = None  # its body's greenlet, once started


class EnsembleWorld(TwinWorld):
    """One member's twin behind the ports; its ``advance`` waits for the ensemble's steps."""

    def __init__(self, twin: Twin, ensemble: TwinEnsemble, index: int) -> None:
        super().__init__(twin)
        self._ensemble = ensemble
        self._index = index

    def __repr__(self) -> str:
        return f"EnsembleWorld({self.twin.spec.name!r}, seed={self.twin.seed}, #{self._index})"

    def advance(self, seconds: float) -> None:
        self._ensemble._wait(self._index, seconds)


class TwinEnsemble:
    """R twins of [(fleet, seed)] run in lockstep (a ``WorldEnsemble``); see the module doc."""

    def __init__(self, members: Sequence[tuple[FleetSpec, int]], hours: float) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.twins = [Twin(fleet, seed, hours_hint=hours) for fleet, seed in members]
        self.worlds = [EnsembleWorld(t, self, k) for k, t in enumerate(self.twins)]
        self._members = [_Member(k, t) for k, t in enumerate(self.twins)]
        self._hub: Any = None  # the greenlet that steps the twins (the caller of ``run``)
        self._stopped = False
        self.serve = ServeTogether(self.twins)
        self.steps = 0  # ensemble steps taken (each one step of every member that asked)
        self.member_steps = 0  # member steps taken, summed over the members

    # -- the body's side ------------------------------------------------------------------------
    def _wait(self, index: int, seconds: float) -> None:
        m = self._members[index]
        if self._stopped:  # stopped while this body ran: it ends, and its end hands control back
            raise EnsembleStopped("the ensemble stopped")
        twin = m.twin
        if twin.spec.quiescent.enabled:  # macro steps of its own: it advances alone
            twin.run_for(seconds)
            return
        end = twin.t + seconds - 1e-9  # what ``Twin.run_for`` steps to
        if twin.t >= end:
            return
        m.end_s = end
        self._hub.switch()
        if self._stopped:
            raise EnsembleStopped("the ensemble stopped")

    def _body(self, m: _Member, body: Callable[[DrillWorld], T], out: list[T | None]) -> None:
        try:
            out[m.index] = body(self.worlds[m.index])
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of ``run``
            m.error = exc
        finally:
            m.done = True
            m.end_s = None

    # -- the ensemble's side --------------------------------------------------------------------
    def run(self, bodies: Sequence[Callable[[DrillWorld], T]]) -> list[T]:
        """Run body ``k`` on world ``k`` in lockstep; their results, in order (module doc)."""
        if len(bodies) != len(self._members):
            raise ValueError(f"{len(bodies)} bodies for {len(self._members)} worlds")
        out: list[T | None] = [None] * len(bodies)
        self._hub = getcurrent()
        try:
            for m, body in zip(self._members, bodies, strict=True):
                m.glet = greenlet(partial(self._body, m, body, out), parent=self._hub)
                self._resume(m)  # it runs until it asks for time (or ends)
            while True:
                for m in self._members:  # resume, in member order, every body whose time came
                    if not m.done and m.end_s is not None and m.twin.t >= m.end_s:
                        m.end_s = None
                        self._resume(m)
                waiting = [m.twin for m in self._members if not m.done]
                if not waiting:
                    break
                self._step(waiting)
        except BaseException:
            self._stop()
            raise
        return [r for r in out]  # type: ignore[misc]  # every body returned

    def _resume(self, m: _Member) -> None:
        m.glet.switch()
        if m.error is not None:
            raise m.error

    def _step(self, twins: list[Twin]) -> None:
        for t in twins:
            t.step_begin()
        self.serve.serve(twins)
        for t in twins:
            t.step_end()
        self.steps += 1
        self.member_steps += len(twins)

    def _stop(self) -> None:
        """Stop every body still running: resumed, its ``advance`` raises ``EnsembleStopped``."""
        self._stopped = True
        for m in self._members:
            if m.glet is not None and not m.done:
                m.glet.switch()


def embedded_ensemble(members: Sequence[tuple[FleetSpec, int]], hours: float) -> TwinEnsemble:
    """Fresh embedded twins of [(fleet, seed)] stepped in lockstep (an ``EnsembleFactory``)."""
    return TwinEnsemble(members, hours)
