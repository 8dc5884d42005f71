"""The Alertmanager webhook payload (version 4), validated before anything is stored.

Alertmanager POSTs one aggregation group per call: its ``alerts`` (firing and resolved), the
receiver, and the group's labels. firedrill needs each alert's ``fingerprint`` and ``startsAt``
(together they identify one firing, so re-sent groups are recognised) and the ``alertname`` and
``cell`` labels (incidents open per cell). A payload that breaks any rule here is refused as a
whole with the path of the bad field, and nothing of it is stored.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cached_property
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

MAX_ALERTS: Final = 1000  # per call; Alertmanager's own default max_alerts is 0 (no cap)
MAX_LABELS: Final = 64
MAX_VALUE_LEN: Final = 1024

LabelName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]{0,127}$")]
LabelValue = Annotated[str, StringConstraints(max_length=MAX_VALUE_LEN)]
Fingerprint = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{1,64}$")]


class WebhookAlert(BaseModel):
    """One alert of the group."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    status: Literal["firing", "resolved"]
    labels: dict[LabelName, LabelValue] = Field(max_length=MAX_LABELS)
    annotations: dict[LabelName, Annotated[str, StringConstraints(max_length=8192)]] = Field(
        default_factory=dict, max_length=MAX_LABELS
    )
    startsAt: datetime
    endsAt: datetime | None = None
    generatorURL: Annotated[str, StringConstraints(max_length=2048)] = ""
    fingerprint: Fingerprint

    @field_validator("labels")
    @classmethod
    def _has_cell_and_name(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in ("alertname", "cell"):
            value = labels.get(key, "")
            if not value.strip():
                raise ValueError(f"the alert has no '{key}' label (incidents open per cell)")
            if len(value) > 200:
                raise ValueError(f"the '{key}' label is longer than 200 characters")
        for key, value in labels.items():
            if "\x00" in value:
                raise ValueError(f"label {key} contains a NUL character")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"label {key} is not valid Unicode text") from exc
        return labels

    @field_validator("startsAt")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("startsAt needs a time zone (RFC 3339)")
        if value.year < 2000:
            raise ValueError("startsAt is before the year 2000: not a firing time")
        return value

    # Computed once per alert (the model is frozen): ingestion asks for them several times.
    @cached_property
    def starts_at_key(self) -> str:
        """``startsAt`` normalised to UTC ISO 8601: the same instant always gives the same text."""
        return self.startsAt.astimezone(UTC).isoformat(timespec="microseconds")

    @cached_property
    def key(self) -> tuple[str, str, str]:
        """What identifies this event: (fingerprint, startsAt, status)."""
        return (self.fingerprint, self.starts_at_key, self.status)

    @cached_property
    def label_pairs(self) -> tuple[tuple[str, str], ...]:
        """The labels as sorted (name, value) pairs: how the incident book keys an alert."""
        return tuple(sorted(self.labels.items()))


class WebhookPayload(BaseModel):
    """Alertmanager's webhook body, version 4."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal["4"]
    groupKey: Annotated[str, StringConstraints(max_length=4096)] = ""
    truncatedAlerts: Annotated[int, Field(ge=0)] = 0
    status: Literal["firing", "resolved"]
    receiver: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    groupLabels: dict[LabelName, LabelValue] = Field(default_factory=dict)
    commonLabels: dict[LabelName, LabelValue] = Field(default_factory=dict)
    commonAnnotations: dict[LabelName, str] = Field(default_factory=dict)
    externalURL: Annotated[str, StringConstraints(max_length=2048)] = ""
    alerts: list[WebhookAlert] = Field(min_length=1, max_length=MAX_ALERTS)

    @field_validator("receiver")
    @classmethod
    def _receiver_named(cls, value: str) -> str:
        if not value.strip() or "\x00" in value:
            raise ValueError("the receiver needs a name")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError("the receiver is not valid Unicode text") from exc
        return value
