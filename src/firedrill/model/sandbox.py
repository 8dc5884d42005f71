"""Agent sandboxes: the operations, the audit records and the egress classifier they share.

Tenants run agent sessions in sandboxes. Every connection a sandbox makes to the outside goes
through the egress proxy (allow-listed destinations pass, the proxy denies the rest), and every
tool call goes through the tool gateway, which classes it by side effect (read, write, money),
refuses a write or money call that carries no approval binding, and enforces the tenant's kill
switch (``<tenant>.max_side_effect`` in ``toolgw-flags``). Both keep an audit record of every
decision; those records are the evidence a security incident preserves.

This module holds what the twin, detection and incident command all need to agree on: the typed
operations (each has an inverse, like every operation), the audit records, the flag names and
``dest_class``, the classifier the proxy's exporter uses to label a destination (a subdomain
that looks like base64 is what DNS-style exfiltration looks like).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Final, Literal

SideEffect = Literal["read", "write", "money"]
SIDE_EFFECTS: Final[tuple[SideEffect, ...]] = ("read", "write", "money")
# A tenant's max_side_effect values, narrowest first; no flag means no kill switch.
SIDE_EFFECT_LEVELS: Final = ("none", "read", "write", "money")
SIDE_EFFECT_SUFFIX: Final = ".max_side_effect"
DENY_ALL_FLAG: Final = "proxy.deny_all"  # "true": the egress proxy denies every destination
QUARANTINE_LABEL: Final = "ir.corp/quarantine"
PromotionKind = Literal["bundle", "toolset"]

DestClass = Literal["allowlisted", "unlisted", "base64-subdomain", "metadata", "kube-api"]
DEST_CLASSES: Final[tuple[DestClass, ...]] = (
    "allowlisted",
    "unlisted",
    "base64-subdomain",
    "metadata",
    "kube-api",
)
EgressDecision = Literal["allow", "deny", "dropped"]  # dropped: cut off by the quarantine policy
ToolOutcome = Literal["ok", "refused", "blocked", "dropped"]
Approved = Literal["true", "false", "not_required"]

METADATA_HOSTS: Final = frozenset({"169.254.169.254", "metadata.google.internal", "fd00:ec2::254"})
KUBE_API_HOSTS: Final = frozenset(
    {
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
)
# A label of base64 or base64url characters, long enough to carry data.
_B64_LABEL = re.compile(r"[A-Za-z0-9+/=_-]{16,63}")
MIN_B64_ENTROPY_BITS: Final = 3.5  # per character; English-like labels stay well below


def sandbox_namespace(tenant: str) -> str:
    """The namespace a tenant's sandboxes run in."""
    return f"sbx-tenant-{tenant}"


def side_effect_rank(value: str | None) -> int:
    """Order of a max_side_effect value: none < read < write < money < no switch < unknown."""
    if value is None:
        return len(SIDE_EFFECT_LEVELS)
    if value in SIDE_EFFECT_LEVELS:
        return SIDE_EFFECT_LEVELS.index(value)
    return len(SIDE_EFFECT_LEVELS) + 1


def _entropy_bits(text: str) -> float:
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def looks_base64(host: str) -> bool:
    """Whether the leftmost label of ``host`` looks like base64-encoded data.

    A label of 16 to 63 base64(url) characters, with upper and lower case letters and a digit,
    and at least 3.5 bits of entropy per character: random bytes encoded in base64 carry about
    4.5 over 32 characters, while hostnames people choose are short, lower case or repetitive.
    """
    label = host.split(".", 1)[0]
    if "." not in host or not _B64_LABEL.fullmatch(label):
        return False
    if not (
        any(c.isupper() for c in label)
        and any(c.islower() for c in label)
        and any(c.isdigit() for c in label)
    ):
        return False
    return _entropy_bits(label) >= MIN_B64_ENTROPY_BITS


def dest_class(host: str, allowlist: frozenset[str]) -> DestClass:
    """How the egress proxy's exporter labels a destination."""
    if host in allowlist:
        return "allowlisted"
    if host in METADATA_HOSTS:
        return "metadata"
    if host in KUBE_API_HOSTS:
        return "kube-api"
    if looks_base64(host):
        return "base64-subdomain"
    return "unlisted"


# ---------------------------------------------------------------------------------------------
# operations (re-exported by ``firedrill.model.operations``)


@dataclass(frozen=True)
class InjectExfiltration:
    """A compromised session of ``tenant`` in ``cell`` smuggles data out as lookups of
    base64-looking subdomains: ``rate_per_s`` egress requests, which the proxy denies."""

    tenant: str
    cell: str
    rate_per_s: float = 2.0


@dataclass(frozen=True)
class ClearExfiltration:
    tenant: str
    cell: str


@dataclass(frozen=True)
class InjectPromptInjection:
    """Content (by hash) retrieved by ``tenant``'s sessions in ``cell`` makes them call a
    ``side_effect`` tool ``rate_per_s`` times a second; ``approved_share`` of the calls carry
    an approval a person gave without noticing, the rest arrive with none."""

    tenant: str
    cell: str
    content_hash: str
    side_effect: Literal["write", "money"] = "write"
    rate_per_s: float = 0.1
    approved_share: float = 0.25


@dataclass(frozen=True)
class ClearPromptInjection:
    tenant: str
    content_hash: str


@dataclass(frozen=True)
class SetWarmPool:
    """``kubectl patch sandboxwarmpool``: the sandboxes a tenant's sessions can claim."""

    tenant: str
    replicas: int


@dataclass(frozen=True)
class FreezePromotions:
    """No new CatalogBundle (or toolset) digest for the product's model; rollbacks still go."""

    product: str
    kind: PromotionKind


@dataclass(frozen=True)
class UnfreezePromotions:
    product: str
    kind: PromotionKind


@dataclass(frozen=True)
class PromoteToolset:
    """Publish a toolset digest in the model's CatalogBundle (a catalog change, stream 2)."""

    model: str
    toolset_digest: str


@dataclass(frozen=True)
class BlockContentHash:
    """Block content (a doc, URL or ticket, by hash) at retrieval for a tenant."""

    tenant: str
    content_hash: str


@dataclass(frozen=True)
class UnblockContentHash:
    tenant: str
    content_hash: str


@dataclass(frozen=True)
class RunCompensations:
    """Run the registered compensation of every write/money call the tenant completed since
    ``since_s`` (only those of ``sessions``, or those caused by ``content_hash``, when given)."""

    tenant: str
    since_s: float
    sessions: tuple[str, ...] = ()
    content_hash: str = ""


SANDBOX_OPERATIONS: Final = (
    InjectExfiltration,
    ClearExfiltration,
    InjectPromptInjection,
    ClearPromptInjection,
    SetWarmPool,
    FreezePromotions,
    UnfreezePromotions,
    PromoteToolset,
    BlockContentHash,
    UnblockContentHash,
    RunCompensations,
)
SandboxOperation = (
    InjectExfiltration | ClearExfiltration | InjectPromptInjection | ClearPromptInjection
    | SetWarmPool | FreezePromotions | UnfreezePromotions | PromoteToolset | BlockContentHash
    | UnblockContentHash | RunCompensations
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# audit records


@dataclass(frozen=True)
class EgressRecord:
    """One egress-proxy decision (or a connection the quarantine policy dropped first)."""

    at_s: float
    tenant: str
    product: str  # the agent product the session serves
    session: str
    pod: str  # namespace/name
    cell: str
    region: str
    dest_host: str
    dest_class: DestClass
    decision: EgressDecision


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool-gateway decision, with its approval binding and what caused it."""

    at_s: float
    tenant: str
    product: str
    session: str
    pod: str
    cell: str
    region: str
    call_id: str
    tool: str
    side_effect: SideEffect
    args_hash: str
    approved: Approved
    approver: str  # "" without an approval binding
    outcome: ToolOutcome
    toolset_digest: str
    content_hash: str = ""  # retrieved content the call followed, when one is known


@dataclass(frozen=True)
class CompensationRecord:
    """A registered compensation that ran for a completed write or money call."""

    at_s: float
    tenant: str
    call_id: str
    session: str
    side_effect: SideEffect
    completed_at_s: float
    content_hash: str = ""
