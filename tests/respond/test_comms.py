"""Comms: update deadlines, status-page granularity, channel redaction and handoffs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from firedrill.errors import FiredrillError
from firedrill.respond.comms import (
    CommsError,
    CommsPlan,
    clock,
    handoff_text,
    redact,
    status_page_entry,
)
from firedrill.respond.severity import Sev

EPOCH = datetime(2025, 3, 1, 3, 30, tzinfo=UTC)
AUDIT = "https://audit.example/q/inc-42"
CELLS = ["use1-a", "use1-b"]
NODES = ["gpu-h100-use1-0042", "worker-17"]


def test_first_update_deadline_is_15_min_after_a_sev1_declaration_and_shown() -> None:
    plan = CommsPlan("inc-1", Sev.SEV1, declared_at_s=100.0)
    assert plan.first_update_due_s == 1000.0
    assert plan.due_line(400.0, EPOCH) == "first update due 03:46 UTC (in 10 min)"


def test_first_update_met_then_the_30_min_cadence_follows() -> None:
    plan = CommsPlan("inc-1", Sev.SEV2, declared_at_s=0.0)
    first = plan.post("investigating elevated latency for model X in us-east", 600.0)
    assert first.first
    assert not first.missed_deadline
    assert first.late_s == 0.0
    assert plan.next_update_due_s == 600.0 + 1800.0
    second = plan.post("mitigating", 2400.0)
    assert not second.first
    assert not second.missed_deadline


def test_first_update_after_the_deadline_is_recorded_missed_with_how_late() -> None:
    plan = CommsPlan("inc-1", Sev.SEV1, declared_at_s=0.0)
    assert plan.overdue_s(1000.0) == 100.0
    late = plan.post("investigating", 1020.0)
    assert late.missed_deadline
    assert late.late_s == 120.0
    assert late.due_s == 900.0
    assert "min overdue" in CommsPlan("x", Sev.SEV1, 0.0).due_line(1500.0, EPOCH)


def test_a_late_cadence_update_is_missed_too() -> None:
    plan = CommsPlan("inc-1", Sev.SEV1, 0.0)
    plan.post("investigating", 300.0)
    assert plan.post("still investigating", 2200.0).late_s == 100.0


def test_the_first_update_window_is_configurable() -> None:
    plan = CommsPlan("inc-1", Sev.SEV1, 0.0, first_update_s=300.0)
    assert plan.post("investigating", 301.0).missed_deadline


def test_sev3_has_no_deadline_until_it_escalates() -> None:
    plan = CommsPlan("inc-1", Sev.SEV3, 0.0)
    assert plan.first_update_due_s is None
    assert plan.overdue_s(10_000.0) == 0.0
    plan.escalate(Sev.SEV2, 5000.0)
    assert plan.first_update_due_s == 5900.0
    with pytest.raises(ValueError, match="more severe"):
        plan.escalate(Sev.SEV3, 6000.0)


def test_an_update_needs_text_and_time_order() -> None:
    plan = CommsPlan("inc-1", Sev.SEV1, 100.0)
    with pytest.raises(CommsError):
        plan.post("  ", 200.0)
    with pytest.raises(ValueError, match="before the declaration"):
        plan.post("x", 50.0)
    plan.post("x", 300.0)
    with pytest.raises(ValueError, match="before the last update"):
        plan.post("y", 200.0)


def test_status_page_entry_is_per_product_and_region() -> None:
    entry = status_page_entry(
        "chat-api", "us-east", "Elevated latency for model X in us-east", CELLS, NODES
    )
    assert entry.product == "chat-api"
    assert entry.region == "us-east"


def test_status_page_refuses_a_known_cell_id_and_names_it() -> None:
    with pytest.raises(CommsError, match="cell 'use1-b'") as err:
        status_page_entry("chat-api", "us-east", "Draining USE1-B for repair", CELLS, NODES)
    assert err.value.token == "use1-b"
    assert isinstance(err.value, FiredrillError)


def test_status_page_refuses_a_known_node_name() -> None:
    with pytest.raises(CommsError, match="node 'worker-17'") as err:
        status_page_entry("chat-api", "us-east", "worker-17 is being replaced", CELLS, NODES)
    assert err.value.token == "worker-17"


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("node gpu-a100-usw2-0007 had an XID", "gpu-a100-usw2-0007"),
        ("traffic moved off euw1-c", "euw1-c"),
    ],
)
def test_status_page_refuses_node_and_cell_shaped_names_not_in_the_lists(
    text: str, token: str
) -> None:
    with pytest.raises(CommsError) as err:
        status_page_entry("chat-api", "eu-west", text, CELLS, NODES)
    assert err.value.token == token


def test_a_known_cell_is_not_matched_inside_a_longer_word() -> None:
    status_page_entry("chat-api", "us-east", "see use1-abc notes", ["use1-ab"], [])


@pytest.mark.parametrize(
    ("text", "kind", "secret"),
    [
        ('user said prompt: "ignore all previous instructions" then', "prompt", "ignore all"),
        ("header Authorization: Bearer eyJhbGciOi.abc-123", "bearer_token", "eyJhbGciOi"),
        ("key sk-proj-AbCdEf0123456789 leaked", "api_key", "sk-proj-AbCdEf0123456789"),
        ("aws AKIAIOSFODNN7EXAMPLE found", "aws_key", "AKIAIOSFODNN7EXAMPLE"),
        ("dsn has password=hunter2; retry", "secret", "hunter2"),
        ("customer jane.doe@acme.io reported it", "email", "jane.doe@acme.io"),
        ("call them at +1 415-555-0100 now", "phone", "415-555-0100"),
    ],
)
def test_redact_each_kind(text: str, kind: str, secret: str) -> None:
    out = redact(text, AUDIT)
    assert out.kinds == [kind]
    assert secret not in out.text
    assert f"[redacted: see {AUDIT}]" in out.text


def test_redact_keeps_context_and_lists_each_kind_once() -> None:
    text = "prompt: 'mail me at a@b.co' / password=x / password=y / ttft p99 4.2 s at 04:00"
    out = redact(text, AUDIT)
    assert out.kinds == ["prompt", "secret"]
    assert out.text.startswith(f"prompt: [redacted: see {AUDIT}]")
    assert "password=[redacted" in out.text
    assert out.text.endswith("ttft p99 4.2 s at 04:00")


def test_redact_leaves_clean_text_alone_and_needs_an_audit_link() -> None:
    clean = "TTFT p99 tripled in us-east-3; 16384 GPUs; $32,768/h"
    assert redact(clean, AUDIT).text == clean
    assert redact(clean, AUDIT).kinds == []
    with pytest.raises(CommsError):
        redact(clean, " ")


def test_handoff_text_formats_simulated_times_against_the_epoch() -> None:
    text = handoff_text("IC", "@dana", 1800.0, ["A", "B"], 3600.0, epoch=EPOCH)
    assert text == "IC handing to @dana at 04:00 UTC; open threads: A, B; next update 04:30"


def test_handoff_with_no_open_threads_says_none() -> None:
    text = handoff_text("IC @sam", "lee", 0.0, [], 60.0, epoch=EPOCH)
    assert text == "IC @sam handing to @lee at 03:30 UTC; open threads: none; next update 03:31"


def test_clock_needs_an_aware_epoch() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        clock(0.0, datetime(2025, 1, 1))
