"""The ``alertmanager.yml`` a fleet loads: page on symptoms, group by cell, inhibit the noise.

Routing follows the alert's ``severity``: ``page`` pages, ``ticket`` (and anything unlabelled)
opens a ticket, ``security`` reaches the security receiver *and* pages (``continue: true``), so a
tripwire is never only a ticket. Grouping by ``cell`` and ``alertname`` turns 400 nodes throwing
the same XID into one notification, not 400.

Two inhibitions mute causes while their symptom is already known: a fast TTFT burn in a cell mutes
that cell's pod, queue and KV-cache tickets, and a NotReady node mutes that node's DCGM and
thermal tickets. Alertmanager compares a label that is missing on both alerts as equal (both
empty), so an ``equal: [cell]`` rule alone would let one alert without ``cell`` mute every
matching alert without ``cell`` fleet-wide. Each rule therefore also requires its ``equal`` labels
to be non-empty on both the source and the target.

Receivers default to ``firedrill serve``'s webhook on loopback (``/api/v1/alerts/webhook``), not
to a pager: a team sets PagerDuty, Slack or its own webhooks per receiver (secrets read from
files, never written into the config), and ``rules generate`` warns until it has.

Pure: values in, a dict or YAML text out. Matchers use the 0.22+ ``matchers`` syntax, not the
deprecated ``match``/``match_re``. Targets Alertmanager 0.25 (``routing_key_file``,
``api_url_file``, ``credentials_file``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

LABEL_NAME_RE = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
WebhookUrl = Annotated[str, Field(pattern=r"^https?://[^\s/]+(/\S*)?$")]
LabelName = Annotated[str, Field(pattern=LABEL_NAME_RE)]


# Where ``firedrill serve`` receives Alertmanager's webhooks (the v4 payload), on this host.
FIREDRILL_SERVE_WEBHOOK = "http://127.0.0.1:8080/api/v1/alerts/webhook"
AbsolutePath = Annotated[str, Field(pattern=r"^/\S+$")]


class PagerDuty(BaseModel):
    """A PagerDuty Events API v2 integration; the routing key is read from a file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    routing_key_file: AbsolutePath
    severity: Literal["critical", "error", "warning", "info"] = "critical"


class Slack(BaseModel):
    """A Slack incoming webhook; its URL (a secret) is read from a file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_url_file: AbsolutePath
    channel: Annotated[str, Field(pattern=r"^[#@]?[a-z0-9._-]{1,80}$")]


class Receiver(BaseModel):
    """Where one receiver's notifications go: webhooks, PagerDuty, Slack, in any combination."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    webhook_urls: list[WebhookUrl] = Field(default_factory=lambda: [FIREDRILL_SERVE_WEBHOOK])
    # firedrill serve authenticates every call: the bearer token Alertmanager presents.
    bearer_token_file: AbsolutePath | None = None
    pagerduty: PagerDuty | None = None
    slack: Slack | None = None

    @model_validator(mode="before")
    @classmethod
    def _url_alone(cls, data: object) -> object:
        # A bare URL is a receiver with that one webhook (the older, shorter spelling).
        return {"webhook_urls": [data]} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _goes_somewhere(self) -> Receiver:
        if not (self.webhook_urls or self.pagerduty or self.slack):
            raise ValueError("a receiver needs a webhook URL, PagerDuty or Slack")
        return self


class Receivers(BaseModel):
    """What each severity's receiver does. The defaults send everything to ``firedrill serve`` on
    this host only: set PagerDuty (page, security), Slack (ticket) or your own webhooks here
    (docs/alerting-receivers.md); ``rules generate`` warns while the defaults are left."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    page: Receiver = Receiver()
    ticket: Receiver = Receiver()
    security: Receiver = Receiver()

    def is_placeholder(self) -> bool:
        """Whether every receiver is still the default (firedrill serve on loopback only)."""
        return self == Receivers()


class RoutingSpec(BaseModel):
    """How alerts are grouped and where each severity goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_by: Annotated[list[LabelName], Field(min_length=1)] = Field(
        default_factory=lambda: ["cell", "alertname"]
    )
    group_wait_s: Annotated[int, Field(ge=0)] = 30
    group_interval_s: Annotated[int, Field(gt=0)] = 300
    repeat_interval_s: Annotated[int, Field(gt=0)] = 14400
    receivers: Receivers = Receivers()

    @model_validator(mode="after")
    def _repeat_not_below_group_interval(self) -> RoutingSpec:
        # Alertmanager only re-sends on a group_interval tick, so a shorter repeat_interval
        # would silently mean group_interval.
        if self.repeat_interval_s < self.group_interval_s:
            raise ValueError(
                f"repeat_interval_s ({self.repeat_interval_s}) must be at least "
                f"group_interval_s ({self.group_interval_s})"
            )
        return self


@dataclass(frozen=True)
class Inhibition:
    """While an alert matching ``source`` fires, mute alerts matching ``target`` that share
    ``equal`` (non-empty) label values with it."""

    source: str
    target: str
    equal: tuple[str, ...]

    def rule(self) -> dict[str, Any]:
        present = [f'{name}=~".+"' for name in self.equal]
        return {
            "source_matchers": [self.source, *present],
            "target_matchers": [self.target, *present],
            "equal": list(self.equal),
        }


INHIBITIONS: tuple[Inhibition, ...] = (
    Inhibition(
        source='alertname="CellTTFTBurnFast"',
        target='alertname=~"PodTTFTHigh|VllmQueueDeep|KVCacheHigh"',
        equal=("cell",),
    ),
    Inhibition(
        source='alertname="NodeNotReady"',
        target='alertname=~"DCGM.*|GPUThermal.*"',
        equal=("node",),
    ),
)

_UNITS_S = (("h", 3600), ("m", 60))


def duration(seconds: int) -> str:
    """Alertmanager duration text in the largest whole unit: 30 -> '30s', 300 -> '5m'."""
    for unit, size in _UNITS_S:
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _receiver(name: str, r: Receiver) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if r.webhook_urls:
        hooks: list[dict[str, Any]] = []
        for url in r.webhook_urls:
            hook: dict[str, Any] = {"url": url, "send_resolved": True}
            if r.bearer_token_file is not None:
                hook["http_config"] = {
                    "authorization": {"type": "Bearer", "credentials_file": r.bearer_token_file}
                }
            hooks.append(hook)
        out["webhook_configs"] = hooks
    if r.pagerduty is not None:
        out["pagerduty_configs"] = [
            {
                "routing_key_file": r.pagerduty.routing_key_file,
                "severity": r.pagerduty.severity,
                "send_resolved": True,
            }
        ]
    if r.slack is not None:
        out["slack_configs"] = [
            {
                "api_url_file": r.slack.api_url_file,
                "channel": r.slack.channel,
                "send_resolved": True,
                "title": "{{ .CommonLabels.alertname }} in {{ .CommonLabels.cell }}",
                "text": "{{ range .Alerts }}{{ .Annotations.summary }}\n{{ end }}",
            }
        ]
    return out


def alertmanager_config(routing: RoutingSpec) -> dict[str, Any]:
    """The Alertmanager configuration as a plain mapping, ready for YAML."""
    r = routing.receivers
    return {
        "route": {
            "receiver": "ticket",
            "group_by": list(routing.group_by),
            "group_wait": duration(routing.group_wait_s),
            "group_interval": duration(routing.group_interval_s),
            "repeat_interval": duration(routing.repeat_interval_s),
            "routes": [
                {"matchers": ['severity="security"'], "receiver": "security", "continue": True},
                {"matchers": ['severity=~"security|page"'], "receiver": "page"},
                {"matchers": ['severity="ticket"'], "receiver": "ticket"},
            ],
        },
        "inhibit_rules": [i.rule() for i in INHIBITIONS],
        "receivers": [
            _receiver("page", r.page),
            _receiver("ticket", r.ticket),
            _receiver("security", r.security),
        ],
    }


def alertmanager_yaml(routing: RoutingSpec) -> str:
    """``alertmanager.yml`` text for ``routing``."""
    return yaml.safe_dump(alertmanager_config(routing), sort_keys=False, width=100)
