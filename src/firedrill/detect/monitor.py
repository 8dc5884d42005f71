"""Drive detection on a clock: advance one evaluation interval, evaluate, repeat."""

from __future__ import annotations

from collections.abc import Callable

from firedrill.detect.evaluator import AlertEvent, BurnRateEvaluator
from firedrill.ports import Clock


def watch(
    clock: Clock,
    evaluator: BurnRateEvaluator,
    *,
    seconds: float,
    every_s: float,
    on_event: Callable[[AlertEvent], None] | None = None,
) -> list[AlertEvent]:
    """Advance ``clock`` by ``seconds`` in steps of ``every_s``, evaluating after each step."""
    events: list[AlertEvent] = []
    if not evaluator.started:
        evaluator.evaluate()  # the first sample (t = 0 for a fresh twin), as Prometheus has it
    end = clock.now_s() + seconds - 1e-9
    while clock.now_s() < end:
        clock.advance(min(every_s, end + 1e-9 - clock.now_s()))
        for ev in evaluator.evaluate():
            events.append(ev)
            if on_event is not None:
                on_event(ev)
    return events


def event_dict(ev: AlertEvent) -> dict[str, object]:
    return {
        "at_s": ev.at_s,
        "alertname": ev.alertname,
        "state": ev.state,
        "labels": dict(ev.labels),
        "value": None if ev.value != ev.value else round(ev.value, 6),
    }
