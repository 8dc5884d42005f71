"""The GPU health policy: what each XID and DCGM field means, what to do, and the budgets.

Defaults follow NVIDIA's XID catalog and the reference runbook: 79 (fell off the bus) drains and
reboots; 48/64/95 and 119/120/140/62 drain and reset the GPU; 63 and 92 are tracked or ticketed
only; 74 (NVLink) drains and tickets; 13/31/43/45 and 109 are application-level and never drain
(a ticket if one GPU repeats them). DCGM field 319 (DBE ECC) drains and resets; 202 (PCIe replay)
tickets, then drains past a threshold. Unhealthy conditions must hold for N consecutive
observations before anything acts, as NodeHealthCheck's durations do.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Action = Literal["track", "ticket", "app", "reset", "reboot", "drain_ticket", "eject"]
# Actions that quarantine (taint + drain) the node.
QUARANTINING: frozenset[str] = frozenset({"reset", "reboot", "drain_ticket"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _default_xids() -> dict[int, Action]:
    table: dict[int, Action] = {79: "reboot", 63: "track", 92: "ticket", 74: "drain_ticket"}
    for x in (48, 64, 95, 119, 120, 140, 62):
        table[x] = "reset"
    for x in (13, 31, 43, 45, 109, 94):
        table[x] = "app"
    return table


class Modules(_Strict):
    """Per-module enable, as NVSentinel has: a disabled module observes nothing."""

    xid: bool = True
    ecc: bool = True
    pcie: bool = True
    row_remap: bool = True
    thermal: bool = True


class Fields(_Strict):
    """DCGM fields (besides 230, the XID) and what they mean. None: not mapped."""

    ecc_dbe: Action | None = "reset"  # field 319
    pcie_replay_ticket_per_5m: Annotated[float, Field(gt=0)] = 1_000.0  # field 202
    pcie_replay_drain_per_5m: Annotated[float, Field(gt=0)] = 100_000.0
    gpu_temp_c: Annotated[float, Field(gt=0)] = 87.0
    thermal: Action | None = "eject"  # a hot GPU's replica straggles: eject it from routing


class Budgets(_Strict):
    min_healthy: Annotated[float, Field(gt=0, le=1)] = 0.90
    max_quarantines_per_cell_hour: Annotated[int, Field(ge=1)] = 20
    flapping_count: Annotated[int, Field(ge=2)] = 2
    flapping_window_s: Annotated[float, Field(gt=0)] = 5400.0  # 90 min
    quarantined_fraction: Annotated[float, Field(gt=0, le=1)] = 0.10


class Timings(_Strict):
    evaluation_interval_s: Annotated[float, Field(gt=0)] = 15.0
    hold_observations: Annotated[int, Field(ge=1)] = 2
    drain_wait_s: Annotated[float, Field(ge=0)] = 60.0  # graceful drain before reset/reboot
    app_repeat_window_s: Annotated[float, Field(gt=0)] = 3600.0
    app_repeat_count: Annotated[int, Field(ge=2)] = 2


class PolicySpec(_Strict):
    dry_run: bool = False
    selector: dict[str, str] = {"nvidia.com/gpu.present": "true"}
    remediation_template: str = "gpu-reboot-template"
    xids: dict[int, Action] = Field(default_factory=_default_xids)
    fields: Fields = Fields()
    modules: Modules = Modules()
    budgets: Budgets = Budgets()
    timings: Timings = Timings()

    def action_for_xid(self, xid: int) -> Action | None:
        return self.xids.get(xid) if self.modules.xid else None
