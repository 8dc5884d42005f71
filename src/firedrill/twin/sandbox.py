"""Agent sandboxes on the twin: sessions, egress-proxy decisions and tool-gateway side effects.

Each tenant runs agent sessions in sandboxes claimed from its warm pool (``TenantSpec.sandboxes``,
``SandboxWarmPool`` replicas). The model, per tenant × cell, in steps of ``SANDBOX_STEP_S``:

* **sessions** arrive in proportion to the requests the tenant sends to the cell (its demand
  share of every model's routed load), so they follow the diurnal curve and the routing; a
  session lasts an exponential ``SESSION_MEAN_S`` on average. A session claims a sandbox from
  the tenant's warm pool, which holds ``replicas`` sandboxes in all: with every one claimed, the
  claim is rejected, and a pool scaled to 0 starts no session at all (running ones go on). The
  pool is sized so that at the start of the run about half of it is in use, and the run starts
  in that steady state;
* **egress**: every session opens ``EGRESS_PER_SESSION_S`` connections a second through the
  egress proxy, mostly to allow-listed destinations; ``UNLISTED_SHARE`` of them go elsewhere and
  are denied. With ``proxy.deny_all`` set, every destination is denied, every tenant's;
* **tools**: every session calls ``TOOL_CALLS_PER_SESSION_S`` tools a second through the tool
  gateway, by side effect read/write/money (``SIDE_EFFECT_MIX``). An agent asks its user before
  a write or money call, so the calls that reach the gateway carry their approval binding; the
  gateway refuses a write or money call without one, and blocks any call above the tenant's
  ``<tenant>.max_side_effect``. A completed write or money call registers its compensation;
* **quarantine**: a pod labelled ``ir.corp/quarantine=true`` is cut off by the deny-all policy
  before the proxy or the gateway see anything (Hubble counts the drops), and when its session
  ends the pod is retained (``shutdownPolicy: Retain``), never deleted.

Injections: an exfiltration (one compromised session sending base64-encoded data as subdomain
lookups, all denied by the proxy) and a prompt injection (retrieved content, known by hash, that
makes sessions call write or money tools, mostly without approval). Levers: the kill switch
(``SetFlag``), warm pool size, a retrieval block on a content hash, freezing CatalogBundle or
toolset promotions of a product (a rollback to a digest the model ran before still goes), and
running the registered compensations.

Counters are aggregated per tenant × cell, and every decision also leaves an audit record in a
bounded ring (``EGRESS_RING`` / ``TOOL_RING`` records), the evidence a security incident exports.

Randomness: each tenant draws from its own generator, and each injection from its own, all
seeded from the run's seed and the tenant's (or injection's) name; nothing here draws from the
serving, demand or fault generators. So injecting into one tenant, or pulling a lever on it,
leaves every other tenant's sessions, egress and tool calls the same bit for bit, and serving is
not touched at all.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import math
from collections import deque
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import TYPE_CHECKING, Final, Protocol

import numpy as np
import numpy.typing as npt

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.changes import ChangeStream
from firedrill.model.sandbox import (
    DENY_ALL_FLAG,
    SANDBOX_OPERATIONS,
    SIDE_EFFECT_SUFFIX,
    SIDE_EFFECTS,
    Approved,
    CompensationRecord,
    DestClass,
    EgressDecision,
    EgressRecord,
    PromotionKind,
    SideEffect,
    ToolCallRecord,
    ToolOutcome,
    dest_class,
    sandbox_namespace,
    side_effect_rank,
)
from firedrill.model.series import Labels, labels_of
from firedrill.model.spec import DIGEST_RE, CatalogBundleSpec, FleetSpec, ModelSpec
from firedrill.twin.demand import Demand

if TYPE_CHECKING:
    from firedrill.twin.recorder import SeriesStore

F64 = npt.NDArray[np.float64]


class SandboxTwin(Protocol):
    """What the sandbox simulation reads and writes of the twin.

    It reads the clock, the spec, the names, the offered load and its routing, the kill-switch
    flags and the quarantined pods; it writes a model's bundle (a toolset promotion) and notes
    its changes in the twin's change log.
    """

    @property
    def spec(self) -> FleetSpec: ...
    @property
    def seed(self) -> int: ...
    @property
    def t(self) -> float: ...
    @property
    def models(self) -> Sequence[ModelSpec]: ...
    @property
    def model_index(self) -> Mapping[str, int]: ...
    @property
    def cell_names(self) -> Sequence[str]: ...
    @property
    def cell_index(self) -> Mapping[str, int]: ...
    @property
    def cell_region(self) -> Sequence[int]: ...
    @property
    def region_names(self) -> Sequence[str]: ...
    @property
    def bundle(self) -> list[CatalogBundleSpec]: ...
    @property
    def flags(self) -> Mapping[str, str]: ...
    @property
    def quarantined_pods(self) -> AbstractSet[str]: ...
    @property
    def demand(self) -> Demand: ...
    @property
    def product_to_model(self) -> F64: ...
    @property
    def lam(self) -> F64: ...
    def routing_matrix(self) -> tuple[F64, F64]: ...
    def lookup_model(self, name: str) -> int: ...
    def lookup_cell(self, name: str) -> int: ...
    def note_change(
        self,
        stream: ChangeStream,
        cell: int,
        subject: str,
        before: str,
        after: str,
        detail: str = "",
    ) -> None: ...
    def note_model_change(self, stream: ChangeStream, mi: int, before: str, after: str) -> None: ...


SANDBOX_OPS: Final = SANDBOX_OPERATIONS
SANDBOX_STEP_S: Final = 15.0  # the sandbox model advances in steps of this many seconds
SESSION_MEAN_S: Final = 300.0  # mean session length (exponential)
TARGET_POOL_UTILIZATION: Final = 0.5  # share of the warm pools in use at the run's start
EGRESS_PER_SESSION_S: Final = 0.1  # egress connections a session opens per second
UNLISTED_SHARE: Final = 0.03  # share of them to destinations off the allowlist
TOOL_CALLS_PER_SESSION_S: Final = 0.05
SIDE_EFFECT_MIX: Final = (0.85, 0.13, 0.02)  # read, write, money
EGRESS_RING: Final = 100_000  # audit records kept (the oldest go first)
TOOL_RING: Final = 50_000
COMPENSATION_TTL_S: Final = 24 * 3600.0  # a registered compensation expires after this

ALLOWLIST: Final = (
    "pypi.mirror.corp",
    "npm.mirror.corp",
    "retrieval.svc.corp",
    "docs.corp",
    "objects.corp",
)
UNLISTED: Final = (
    "pypi.org",
    "github.com",
    "raw.githubusercontent.com",
    "pastebin.com",
    "transfer.sh",
    "webhook.site",
)
ATTACKER_DOMAINS: Final = ("cdn-sync.net", "telemetry-edge.io", "static-assets.org")
TOOLS: Final[dict[SideEffect, tuple[str, ...]]] = {
    "read": ("search_docs", "read_ticket", "fetch_url"),
    "write": ("update_ticket", "send_email", "commit_file"),
    "money": ("issue_refund", "purchase"),
}
# (dest_class, decision) pairs the proxy can count: it allows allow-listed destinations only.
CONNECTION_KINDS: Final[tuple[tuple[DestClass, EgressDecision], ...]] = (
    ("allowlisted", "allow"),
    ("allowlisted", "deny"),
    ("unlisted", "deny"),
    ("base64-subdomain", "deny"),
    ("metadata", "deny"),
    ("kube-api", "deny"),
)
# (side_effect, approved, outcome) triples the gateway can count.
CALL_KINDS: Final[tuple[tuple[SideEffect, Approved, ToolOutcome], ...]] = (
    ("read", "not_required", "ok"),
    ("read", "not_required", "blocked"),
    ("write", "true", "ok"),
    ("write", "true", "blocked"),
    ("write", "false", "refused"),
    ("write", "false", "blocked"),
    ("money", "true", "ok"),
    ("money", "true", "blocked"),
    ("money", "false", "refused"),
    ("money", "false", "blocked"),
)
# Per active session and second: egress to the allowlist, elsewhere, tool calls by side effect.
_RATES: Final = np.array(
    [
        EGRESS_PER_SESSION_S * (1.0 - UNLISTED_SHARE),
        EGRESS_PER_SESSION_S * UNLISTED_SHARE,
        *(TOOL_CALLS_PER_SESSION_S * share for share in SIDE_EFFECT_MIX),
    ]
)
_CONN_INDEX: Final = {k: i for i, k in enumerate(CONNECTION_KINDS)}
_CALL_INDEX: Final = {k: i for i, k in enumerate(CALL_KINDS)}
# A baseline call's counter by [side effect, blocked]: write/money calls carry their approval.
_BASE_CALL_INDEX: Final = np.array(
    [
        [
            _CALL_INDEX[("read", "not_required", "ok")],
            _CALL_INDEX[("read", "not_required", "blocked")],
        ],
        [_CALL_INDEX[("write", "true", "ok")], _CALL_INDEX[("write", "true", "blocked")]],
        [_CALL_INDEX[("money", "true", "ok")], _CALL_INDEX[("money", "true", "blocked")]],
    ],
    dtype=np.int64,
)
_N_TOOLS: Final = np.array([len(TOOLS[x]) for x in SIDE_EFFECTS])  # by side-effect index
_ToolTuple = tuple[
    float, int, "_Session", int, int, str, SideEffect, Approved, ToolOutcome, str, str
]
_EgressTuple = tuple[float, int, "_Session", int, str, DestClass, EgressDecision]
_SPAWN_TAG: Final = 0x5B0C  # sandbox streams' spawn key, apart from the engine's own children


def _stable(text: str) -> int:
    """A 64-bit integer from a name, the same in every process (``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _stream(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng(
        np.random.SeedSequence(seed, spawn_key=(_SPAWN_TAG, _stable(name)))
    )


def _call_id(tenant: str, number: int) -> str:
    return f"call-{tenant}-{number:08d}"


@dataclass
class _Session:
    serial: int
    id: str
    pod: str
    cell: int
    model: int
    product: str
    start_s: float
    end_s: float
    pinned_end_s: float | None = None  # the natural end, while an injection holds it open


@dataclass
class _Registered:
    """A completed write/money call whose compensation is registered."""

    at_s: float
    call_id: str
    session: str
    side_effect: SideEffect
    content_hash: str
    done: bool = False


class _Counters:
    """Every tenant's counters, one array per series family with a row per tenant.

    A tenant works on views of its own rows, and a scrape writes each family in one copy.
    """

    def __init__(self, n_tenants: int, n_cells: int) -> None:
        self.started = np.zeros((n_tenants, n_cells))
        self.rejected = np.zeros((n_tenants, n_cells))
        self.connections = np.zeros((n_tenants, n_cells, len(CONNECTION_KINDS)))
        self.calls_counted = np.zeros((n_tenants, n_cells, len(CALL_KINDS)))
        self.drops = np.zeros((n_tenants, n_cells))
        self.compensations = np.zeros((n_tenants, 2))  # write, money
        self.sessions = np.zeros((n_tenants, n_cells), dtype=np.int64)  # active, per cell


@dataclass
class _Tenant:
    index: int
    name: str
    share: float
    spec_pool: int
    pool: int
    rng: np.random.Generator
    namespace: str
    n_cells: int
    counters: _Counters
    sessions: dict[int, _Session] = field(default_factory=dict)
    by_cell: list[list[int]] = field(default_factory=list)  # active session serials per cell
    ends: list[tuple[float, int]] = field(default_factory=list)  # heap: (end_s, serial)
    serial: int = 0
    calls: int = 0
    blocked_hashes: set[str] = field(default_factory=set)
    registered: deque[_Registered] = field(default_factory=deque)
    active: int = 0  # sessions running, all cells

    def __post_init__(self) -> None:
        self.by_cell = [[] for _ in range(self.n_cells)]
        c, i = self.counters, self.index
        self.started = c.started[i]
        self.rejected = c.rejected[i]
        self.connections = c.connections[i]
        self.calls_counted = c.calls_counted[i]
        self.drops = c.drops[i]
        self.compensations = c.compensations[i]
        self.per_cell = c.sessions[i]  # len(by_cell[cell]), kept in step with it
        self.retrieval_blocked = 0.0


@dataclass
class _Exfil:
    tenant: int
    cell: int
    rate_per_s: float
    rng: np.random.Generator
    domain: str
    session: int  # serial of the compromised session


@dataclass
class _Prompt:
    op: ops.InjectPromptInjection
    tenant: int
    cell: int
    rng: np.random.Generator


class SandboxSim:
    """Owns the tenants' sandboxes, the egress proxy and the tool gateway of a twin."""

    def __init__(self, twin: SandboxTwin) -> None:
        self.twin = twin
        spec = twin.spec
        self.enabled = bool(spec.tenants)
        self.allowlist = frozenset(ALLOWLIST)
        nc = len(twin.cell_names)
        self.counters = _Counters(len(spec.tenants), nc)
        self.tenants = [
            _Tenant(
                index=i,
                name=t.name,
                share=t.share,
                spec_pool=t.sandboxes,
                pool=t.sandboxes,
                rng=_stream(twin.seed, f"tenant/{t.name}"),
                namespace=sandbox_namespace(t.name),
                n_cells=nc,
                counters=self.counters,
            )
            for i, t in enumerate(spec.tenants)
        ]
        self.tenant_index = {t.name: t.index for t in self.tenants}
        self.products = {p.name: twin.model_index[p.model] for p in spec.products}
        self.model_product: dict[int, str] = {}
        for name, mi in self.products.items():
            self.model_product.setdefault(mi, name)  # a model's sessions serve its first product
        # what a scrape writes while no pod is quarantined and no promotion is frozen
        self._no_quarantine = np.zeros(len(self.tenants))
        self._none_frozen = np.zeros(2 * len(self.products))
        self.exfil: dict[tuple[int, int], _Exfil] = {}
        self.prompts: dict[tuple[int, str], _Prompt] = {}
        self.frozen: set[tuple[str, PromotionKind]] = set()
        self._seen: dict[tuple[PromotionKind, int], set[str]] = {}
        self._note_catalog()
        # (at_s, tenant, session, cell, host, dest_class, decision)
        self.egress_log: deque[_EgressTuple] = deque(maxlen=EGRESS_RING)
        # (at_s, tenant, session, cell, call number, tool, side effect, approved, outcome,
        #  toolset digest, content hash)
        self.tool_log: deque[_ToolTuple] = deque(maxlen=TOOL_RING)
        self.egress_evicted_before_s = -math.inf  # records older than this may be gone
        self.tool_evicted_before_s = -math.inf
        self.compensation_log: list[CompensationRecord] = []
        self.retained: set[str] = set()  # pods of ended sessions kept under quarantine
        self._pods: dict[str, tuple[int, int]] = {}  # pod -> (tenant, serial), live or retained
        self._last_s = 0.0
        self._next_s = SANDBOX_STEP_S
        # Sessions per request: the warm pools hold TARGET_POOL_UTILIZATION of their sandboxes
        # busy at the expected load of the run's start.
        rps0 = self._expected_load()
        total_pool = sum(t.spec_pool for t in self.tenants)
        base = float(rps0.sum())
        self.sessions_per_request = (
            TARGET_POOL_UTILIZATION * total_pool / (SESSION_MEAN_S * base) if base > 0 else 0.0
        )
        for t in self.tenants:
            self._warm_start(t, rps0)

    # ------------------------------------------------------------------------------------------
    # construction
    def _expected_load(self) -> F64:
        """Requests/s per model × cell at t = 0, without the demand noise (no draws)."""
        twin = self.twin
        d = twin.demand
        rps = d.peak * d.shape(0.0)  # [products, regions]
        d_model = twin.product_to_model @ rps  # [models, regions]
        share, _ = twin.routing_matrix()
        out: F64 = (d_model[:, :, None] * share).sum(axis=1)
        return out

    def _warm_start(self, t: _Tenant, rps0: F64) -> None:
        if t.spec_pool == 0:
            return
        mean = t.share * self.sessions_per_request * rps0 * SESSION_MEAN_S  # [models, cells]
        n = t.rng.poisson(mean)
        self._admit(t, n, 0.0, started=False)

    # ------------------------------------------------------------------------------------------
    # the step
    def step(self) -> None:
        twin = self.twin
        now = twin.t
        if now < self._next_s - 1e-9:
            return
        dt = now - self._last_s
        self._last_s = now
        self._next_s = now + SANDBOX_STEP_S
        self._note_catalog()
        nm, nc = len(twin.models), len(twin.cell_names)
        lam = twin.lam.reshape(nm, nc)
        deny_all = twin.flags.get(DENY_ALL_FLAG) == "true"
        for t in self.tenants:
            self._end_sessions(t, now)
            if t.spec_pool or t.pool:
                rate = t.share * self.sessions_per_request * lam * dt
                self._admit(t, t.rng.poisson(rate), now, started=True)
            self._traffic(t, now, dt, deny_all)
        for ex in self.exfil.values():
            self._exfiltrate(ex, now, dt, deny_all)
        for pr in self.prompts.values():
            self._inject_calls(pr, now, dt)
        self._expire_registrations(now)

    def _admit(
        self, t: _Tenant, arrivals: npt.NDArray[np.int64], now: float, *, started: bool
    ) -> None:
        """Start sessions for ``arrivals`` [models, cells], as far as the warm pool allows."""
        total = int(arrivals.sum())
        if total == 0:
            return
        free = max(t.pool - t.active, 0)
        accepted = arrivals
        if total > free:
            accepted = _largest_remainder(arrivals, free)
            t.rejected += (arrivals - accepted).sum(axis=0)
        n_new = int(accepted.sum())
        if n_new == 0:
            return
        if started:
            t.started += accepted.sum(axis=0)
        lengths = t.rng.exponential(SESSION_MEAN_S, size=n_new)
        k = 0
        for mi, ci in zip(*np.nonzero(accepted), strict=True):
            for _ in range(int(accepted[mi, ci])):
                self._new_session(t, int(ci), int(mi), now, now + float(lengths[k]))
                k += 1

    def _new_session(self, t: _Tenant, cell: int, model: int, now: float, end_s: float) -> _Session:
        serial = t.serial
        t.serial += 1
        # an odd multiplier mod 2**24 is a bijection: unique ids for the first 16M sessions
        sid = f"sess-{(serial * 0x9E3779 + 0x7F3A9C) % (1 << 24):06x}"
        product = self.model_product.get(model, "")
        s = _Session(serial, sid, f"{t.namespace}/{sid}-0", cell, model, product, now, end_s)
        t.sessions[serial] = s
        t.by_cell[cell].append(serial)
        t.per_cell[cell] += 1
        t.active += 1
        heapq.heappush(t.ends, (end_s, serial))
        self._pods[s.pod] = (t.index, serial)
        return s

    def _end_sessions(self, t: _Tenant, now: float) -> None:
        while t.ends and t.ends[0][0] <= now:
            end_s, serial = heapq.heappop(t.ends)
            s = t.sessions.get(serial)
            if s is None or s.end_s != end_s:
                continue  # stale: the session was pinned or already ended
            self._close(t, s)

    def _close(self, t: _Tenant, s: _Session) -> None:
        del t.sessions[s.serial]
        t.by_cell[s.cell].remove(s.serial)
        t.per_cell[s.cell] -= 1
        t.active -= 1
        if s.pod in self.twin.quarantined_pods:
            self.retained.add(s.pod)  # shutdownPolicy: Retain; the pod stays for forensics
        else:
            del self._pods[s.pod]

    def _quarantined(self, s: _Session) -> bool:
        return s.pod in self.twin.quarantined_pods

    def _traffic(self, t: _Tenant, now: float, dt: float, deny_all: bool) -> None:
        """One step of every session's own egress and tool calls, drawn per cell at once."""
        n_active = t.active
        if n_active == 0:
            return
        sizes = t.per_cell
        nc = sizes.size
        flat = t.rng.poisson(np.multiply.outer(_RATES * dt, sizes).reshape(-1))  # kind * nc + cell
        total = int(flat.sum())
        if total == 0:
            return
        u = t.rng.random((2, total))  # the session, then the destination or the tool
        group = np.repeat(np.arange(flat.size), flat)
        kind, cell = group // nc, group % nc
        j = np.arange(total) - np.repeat(np.cumsum(flat) - flat, flat)
        at = np.round(now - dt + dt * (j + 1) / (np.repeat(flat, flat) + 1), 3)
        serials = np.fromiter(chain.from_iterable(t.by_cell), np.int64, n_active)
        first = np.cumsum(sizes) - sizes
        who = serials[first[cell] + (u[0] * sizes[cell]).astype(np.int64)]
        choice = u[1]
        cut = self._cut_off(t, who)
        # events come kind by kind: egress (kinds 0 and 1) first, then the tool calls
        n_net = int(flat[: 2 * nc].sum())
        if n_net > 0:
            net = slice(0, n_net)
            self._connections(
                t,
                cell[net],
                at[net],
                who[net],
                kind[net],
                choice[net],
                None if cut is None else cut[net],
                deny_all,
            )
        if n_net < total:
            tool = slice(n_net, total)
            self._tool_calls(
                t,
                cell[tool],
                at[tool],
                who[tool],
                kind[tool] - 2,
                choice[tool],
                None if cut is None else cut[tool],
            )

    def _cut_off(self, t: _Tenant, who: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_] | None:
        """Which events come from a quarantined pod (cut off before the proxy and gateway);
        None when no pod is quarantined."""
        quarantined = self.twin.quarantined_pods
        if not quarantined:
            return None
        cut = [k for k, s in t.sessions.items() if s.pod in quarantined]
        return np.isin(who, np.array(cut, dtype=np.int64))

    def _connections(
        self,
        t: _Tenant,
        cell: npt.NDArray[np.int64],
        at: F64,
        who: npt.NDArray[np.int64],
        kind: npt.NDArray[np.int64],
        choice: F64,
        cut: npt.NDArray[np.bool_] | None,
        deny_all: bool,
    ) -> None:
        """Baseline egress: kind 0 to the allowlist, kind 1 to unlisted destinations."""
        allowed = kind == 0
        pick = np.where(allowed, choice * len(ALLOWLIST), choice * len(UNLISTED)).astype(np.int64)
        deny_allow = _CONN_INDEX[("allowlisted", "deny" if deny_all else "allow")]
        conn = np.where(allowed, deny_allow, _CONN_INDEX[("unlisted", "deny")])
        if cut is None:
            np.add.at(t.connections, (cell, conn), 1.0)
        else:
            passed = ~cut
            np.add.at(t.connections, (cell[passed], conn[passed]), 1.0)
            if cut.any():
                np.add.at(t.drops, cell[cut], 1.0)
        allow_decision: EgressDecision = "deny" if deny_all else "allow"
        sessions = t.sessions
        spill = min(len(self.egress_log) + at.size - EGRESS_RING, len(self.egress_log))
        if spill > 0:
            gone = max(self.egress_log[i][0] for i in range(spill))
            self.egress_evicted_before_s = max(self.egress_evicted_before_s, gone)
        self.egress_log.extend(
            (
                a,
                t.index,
                sessions[w],
                c,
                ALLOWLIST[p] if ok else UNLISTED[p],
                "allowlisted" if ok else "unlisted",
                "dropped" if x else (allow_decision if ok else "deny"),
            )
            for a, w, c, p, ok, x in zip(
                at.tolist(),
                who.tolist(),
                cell.tolist(),
                pick.tolist(),
                allowed.tolist(),
                [False] * at.size if cut is None else cut.tolist(),
                strict=True,
            )
        )

    def _tool_calls(
        self,
        t: _Tenant,
        cell: npt.NDArray[np.int64],
        at: F64,
        who: npt.NDArray[np.int64],
        se: npt.NDArray[np.int64],
        choice: F64,
        cut: npt.NDArray[np.bool_] | None,
    ) -> None:
        """Baseline tool calls (se: 0 read, 1 write, 2 money), each with its approval binding."""
        max_rank = side_effect_rank(self.twin.flags.get(t.name + SIDE_EFFECT_SUFFIX))
        blocked = (se + 1) > max_rank  # read, write, money rank 1, 2, 3 among the levels
        idx = _BASE_CALL_INDEX[se, blocked.astype(np.int64)]
        if cut is None:
            np.add.at(t.calls_counted, (cell, idx), 1.0)
        else:
            counted = ~cut
            np.add.at(t.calls_counted, (cell[counted], idx[counted]), 1.0)
            if cut.any():
                np.add.at(t.drops, cell[cut], 1.0)
        tool = (choice * _N_TOOLS[se]).astype(np.int64)
        number = t.calls
        t.calls += at.size
        bundle = self.twin.bundle
        sessions = t.sessions
        records: list[_ToolTuple] = []
        for a, w, c, e, tl, b, x in zip(
            at.tolist(),
            who.tolist(),
            cell.tolist(),
            se.tolist(),
            tool.tolist(),
            blocked.tolist(),
            [False] * at.size if cut is None else cut.tolist(),
            strict=True,
        ):
            s = sessions[w]
            side_effect = SIDE_EFFECTS[e]
            outcome: ToolOutcome = "dropped" if x else ("blocked" if b else "ok")
            if outcome == "ok" and e != 0:  # a completed write or money call
                t.registered.append(_Registered(a, _call_id(t.name, number), s.id, side_effect, ""))
            approved: Approved = "not_required" if e == 0 else "true"
            toolset = bundle[s.model].toolset_digest
            tool_name = TOOLS[side_effect][tl]
            records.append(
                (a, t.index, s, c, number, tool_name, side_effect, approved, outcome, toolset, "")
            )
            number += 1
        log = self.tool_log
        spill = len(log) + len(records) - TOOL_RING  # the oldest records roll off the ring
        if spill > 0:
            gone = max(r[0] for r in islice(chain(log, records), spill))
            self.tool_evicted_before_s = max(self.tool_evicted_before_s, gone)
        log.extend(records)

    def _call(
        self,
        t: _Tenant,
        s: _Session,
        ci: int,
        se: SideEffect,
        tool: str,
        approved: Approved,
        at_s: float,
        max_se: str | None,
        content_hash: str,
    ) -> None:
        """One tool call through the gateway: quarantine, kill switch, approval, in that order."""
        outcome: ToolOutcome
        if self._quarantined(s):
            outcome = "dropped"  # the gateway never sees it
            t.drops[ci] += 1
        elif side_effect_rank(se) > side_effect_rank(max_se):
            outcome = "blocked"
        elif se != "read" and approved != "true":
            outcome = "refused"
        else:
            outcome = "ok"
        if outcome != "dropped":
            t.calls_counted[ci, _CALL_INDEX[(se, approved, outcome)]] += 1
        number = t.calls
        t.calls += 1
        toolset = self.twin.bundle[s.model].toolset_digest
        self._log_call(t, s, ci, number, tool, se, approved, outcome, at_s, toolset, content_hash)

    def _log_call(
        self,
        t: _Tenant,
        s: _Session,
        ci: int,
        number: int,
        tool: str,
        se: SideEffect,
        approved: Approved,
        outcome: ToolOutcome,
        at_s: float,
        toolset: str,
        content_hash: str,
    ) -> None:
        if outcome == "ok" and se != "read":
            t.registered.append(_Registered(at_s, _call_id(t.name, number), s.id, se, content_hash))
        log = self.tool_log
        if len(log) == log.maxlen:
            self.tool_evicted_before_s = max(self.tool_evicted_before_s, log[0][0])
        log.append(
            (
                at_s,
                t.index,
                s,
                ci,
                number,
                tool,
                se,
                approved,
                outcome,
                toolset,
                content_hash,
            )
        )

    def _connect(
        self, t: _Tenant, s: _Session, ci: int, host: str, at_s: float, deny_all: bool
    ) -> None:
        """One egress connection through the proxy (or dropped by the quarantine first)."""
        cls = dest_class(host, self.allowlist)
        decision: EgressDecision
        if self._quarantined(s):
            decision = "dropped"
            t.drops[ci] += 1
        else:
            decision = "allow" if cls == "allowlisted" and not deny_all else "deny"
            t.connections[ci, _CONN_INDEX[(cls, decision)]] += 1
        log = self.egress_log
        if len(log) == log.maxlen:
            self.egress_evicted_before_s = max(self.egress_evicted_before_s, log[0][0])
        log.append((at_s, t.index, s, ci, host, cls, decision))

    def _exfiltrate(self, ex: _Exfil, now: float, dt: float, deny_all: bool) -> None:
        t = self.tenants[ex.tenant]
        s = t.sessions.get(ex.session)
        if s is None:
            return
        n = int(ex.rng.poisson(ex.rate_per_s * dt))
        if n == 0:
            return
        for at in _spread(now - dt, dt, n):
            label = base64.urlsafe_b64encode(ex.rng.bytes(24)).decode().rstrip("=")
            self._connect(t, s, s.cell, f"{label}.{ex.domain}", at, deny_all)

    def _inject_calls(self, pr: _Prompt, now: float, dt: float) -> None:
        t = self.tenants[pr.tenant]
        n = int(pr.rng.poisson(pr.op.rate_per_s * dt))
        active = t.by_cell[pr.cell]
        if n == 0 or not active:
            return
        if pr.op.content_hash in t.blocked_hashes:
            t.retrieval_blocked += n  # blocked at retrieval: the content never reaches a model
            return
        max_se = self.twin.flags.get(t.name + SIDE_EFFECT_SUFFIX)
        u = pr.rng.random(3 * n)
        tools = TOOLS[pr.op.side_effect]
        for j, at in enumerate(_spread(now - dt, dt, n)):
            s = t.sessions[active[int(u[3 * j] * len(active))]]
            approved: Approved = "true" if u[3 * j + 1] < pr.op.approved_share else "false"
            tool = tools[int(u[3 * j + 2] * len(tools))]
            self._call(
                t, s, pr.cell, pr.op.side_effect, tool, approved, at, max_se, pr.op.content_hash
            )

    def _expire_registrations(self, now: float) -> None:
        for t in self.tenants:
            while t.registered and t.registered[0].at_s < now - COMPENSATION_TTL_S:
                t.registered.popleft()

    # ------------------------------------------------------------------------------------------
    # catalog promotions
    def _note_catalog(self) -> None:
        """Remember every bundle and toolset digest each model has run (rollback targets)."""
        for mi, b in enumerate(self.twin.bundle):
            self._seen.setdefault(("bundle", mi), set()).add(b.digest)
            self._seen.setdefault(("toolset", mi), set()).add(b.toolset_digest)

    def _frozen_for(self, kind: PromotionKind, model: int) -> str | None:
        for product, k in sorted(self.frozen):
            if k == kind and self.products[product] == model:
                return product
        return None

    def check(self, op: ops.Operation) -> None:
        """Refuse a promotion the freeze holds back: a new digest for a frozen product's model."""
        if not self.frozen:
            return
        self._note_catalog()
        if isinstance(op, ops.SetServingConfig):
            kind: PromotionKind = "bundle"
            model, digest = op.model, op.bundle_digest
        elif isinstance(op, ops.PromoteToolset):
            kind, model, digest = "toolset", op.model, op.toolset_digest
        else:
            return
        mi = self.twin.model_index.get(model)
        if mi is None:
            return  # the engine names the unknown model
        product = self._frozen_for(kind, mi)
        if product is not None and digest not in self._seen[(kind, mi)]:
            raise OperationError(
                f"{kind} promotions of product '{product}' are frozen: {digest} is new for "
                f"{model}; only a rollback to a digest it ran before goes"
            )

    # ------------------------------------------------------------------------------------------
    # operations
    def _tenant(self, name: str) -> _Tenant:
        i = self.tenant_index.get(name)
        if i is None:
            raise UnknownTargetError("tenant", name)
        return self.tenants[i]

    def _product(self, name: str) -> None:
        if name not in self.products:
            raise UnknownTargetError("product", name)

    def has_pod(self, pod: str) -> bool:
        """A sandbox pod that exists: its session runs, or it is retained under quarantine."""
        return pod in self._pods

    def inverse(self, op: ops.Operation) -> ops.Operation:
        twin = self.twin
        match op:
            case ops.InjectExfiltration(tenant=tenant, cell=cell, rate_per_s=rate):
                t, ci = self._tenant(tenant), twin.lookup_cell(cell)
                if not (math.isfinite(rate) and rate > 0):
                    raise OperationError(f"rate_per_s must be > 0, not {rate}")
                ex = self.exfil.get((t.index, ci))
                if ex is not None:
                    return ops.InjectExfiltration(tenant, cell, ex.rate_per_s)
                return ops.ClearExfiltration(tenant, cell)
            case ops.ClearExfiltration(tenant=tenant, cell=cell):
                t, ci = self._tenant(tenant), twin.lookup_cell(cell)
                ex = self.exfil.get((t.index, ci))
                if ex is None:
                    return ops.Noop("no exfiltration")
                return ops.InjectExfiltration(tenant, cell, ex.rate_per_s)
            case ops.InjectPromptInjection(tenant=tenant, cell=cell, content_hash=h):
                t = self._tenant(tenant)
                twin.lookup_cell(cell)
                if not h.strip():
                    raise OperationError("a prompt injection names its content hash")
                if op.side_effect not in ("write", "money"):
                    raise OperationError(f"side_effect is write or money, not {op.side_effect!r}")
                if not (math.isfinite(op.rate_per_s) and op.rate_per_s > 0):
                    raise OperationError(f"rate_per_s must be > 0, not {op.rate_per_s}")
                if not 0.0 <= op.approved_share <= 1.0:
                    raise OperationError(f"approved_share is 0..1, not {op.approved_share}")
                pr = self.prompts.get((t.index, h))
                return pr.op if pr is not None else ops.ClearPromptInjection(tenant, h)
            case ops.ClearPromptInjection(tenant=tenant, content_hash=h):
                t = self._tenant(tenant)
                pr = self.prompts.get((t.index, h))
                return pr.op if pr is not None else ops.Noop("no prompt injection")
            case ops.SetWarmPool(tenant=tenant, replicas=n):
                t = self._tenant(tenant)
                if n < 0:
                    raise OperationError(f"warm pool replicas must be >= 0, not {n}")
                return ops.SetWarmPool(tenant, t.pool)
            case ops.FreezePromotions(product=product, kind=kind):
                self._product(product)
                _kind(kind)
                if (product, kind) in self.frozen:
                    return ops.Noop("already frozen")
                return ops.UnfreezePromotions(product, kind)
            case ops.UnfreezePromotions(product=product, kind=kind):
                self._product(product)
                _kind(kind)
                if (product, kind) in self.frozen:
                    return ops.FreezePromotions(product, kind)
                return ops.Noop("not frozen")
            case ops.PromoteToolset(model=model, toolset_digest=digest):
                mi = twin.lookup_model(model)
                if not DIGEST_RE.fullmatch(digest):
                    raise OperationError(f"{digest!r} is not a sha256 digest")
                return ops.PromoteToolset(model, twin.bundle[mi].toolset_digest)
            case ops.BlockContentHash(tenant=tenant, content_hash=h):
                t = self._tenant(tenant)
                if not h.strip():
                    raise OperationError("a retrieval block names a content hash")
                if h in t.blocked_hashes:
                    return ops.Noop("already blocked")
                return ops.UnblockContentHash(tenant, h)
            case ops.UnblockContentHash(tenant=tenant, content_hash=h):
                t = self._tenant(tenant)
                if h in t.blocked_hashes:
                    return ops.BlockContentHash(tenant, h)
                return ops.Noop("not blocked")
            case ops.RunCompensations(tenant=tenant, since_s=since):
                self._tenant(tenant)
                if not (math.isfinite(since) and since >= 0):
                    raise OperationError(f"since_s must be a time >= 0, not {since}")
                return ops.Noop("a compensation is a write of its own: it is not undone")
        raise OperationError(f"unsupported operation {op!r}")

    def apply(self, op: ops.Operation) -> None:
        twin = self.twin
        match op:
            case ops.InjectExfiltration(tenant=tenant, cell=cell, rate_per_s=rate):
                t, ci = self._tenant(tenant), twin.cell_index[cell]
                ex = self.exfil.get((t.index, ci))
                if ex is not None:
                    ex.rate_per_s = rate
                    return
                rng = _stream(twin.seed, f"exfil/{tenant}/{cell}")
                domain = ATTACKER_DOMAINS[int(rng.integers(len(ATTACKER_DOMAINS)))]
                s = self._compromised(t, ci)
                self.exfil[(t.index, ci)] = _Exfil(t.index, ci, rate, rng, domain, s.serial)
            case ops.ClearExfiltration(tenant=tenant, cell=cell):
                t, ci = self._tenant(tenant), twin.cell_index[cell]
                ex = self.exfil.pop((t.index, ci), None)
                if ex is not None:
                    self._release(t, ex.session)
            case ops.InjectPromptInjection(tenant=tenant, cell=cell, content_hash=h):
                t = self._tenant(tenant)
                key = (t.index, h)
                old = self.prompts.get(key)
                rng = old.rng if old is not None else _stream(twin.seed, f"prompt/{tenant}/{h}")
                self.prompts[key] = _Prompt(op, t.index, twin.cell_index[cell], rng)
            case ops.ClearPromptInjection(tenant=tenant, content_hash=h):
                t = self._tenant(tenant)
                self.prompts.pop((t.index, h), None)
            case ops.SetWarmPool(tenant=tenant, replicas=n):
                t = self._tenant(tenant)
                before, t.pool = t.pool, n
                if before != n:
                    twin.note_change(
                        "network_policy",
                        -1,
                        f"{t.namespace}/sandboxwarmpool",
                        str(before),
                        str(n),
                        "warm pool replicas",
                    )
            case ops.FreezePromotions(product=product, kind=kind):
                if (product, kind) not in self.frozen:
                    self.frozen.add((product, kind))
                    self._record_freeze(product, kind, "open", "frozen")
            case ops.UnfreezePromotions(product=product, kind=kind):
                if (product, kind) in self.frozen:
                    self.frozen.discard((product, kind))
                    self._record_freeze(product, kind, "frozen", "open")
            case ops.PromoteToolset(model=model, toolset_digest=digest):
                mi = twin.model_index[model]
                bundle = twin.bundle[mi]
                if bundle.toolset_digest != digest:
                    twin.bundle[mi] = bundle.model_copy(update={"toolset_digest": digest})
                    twin.note_model_change(
                        "bundle", mi, f"toolset {bundle.toolset_digest}", f"toolset {digest}"
                    )
                    self._note_catalog()
            case ops.BlockContentHash(tenant=tenant, content_hash=h):
                t = self._tenant(tenant)
                if h not in t.blocked_hashes:
                    t.blocked_hashes.add(h)
                    twin.note_change(
                        "network_policy",
                        -1,
                        f"retrieval-blocklist/{tenant}",
                        "",
                        h,
                        "content blocked at retrieval",
                    )
            case ops.UnblockContentHash(tenant=tenant, content_hash=h):
                t = self._tenant(tenant)
                if h in t.blocked_hashes:
                    t.blocked_hashes.discard(h)
                    twin.note_change(
                        "network_policy",
                        -1,
                        f"retrieval-blocklist/{tenant}",
                        h,
                        "",
                        "retrieval block lifted",
                    )
            case ops.RunCompensations(tenant=tenant, since_s=since, sessions=sessions):
                self._compensate(self._tenant(tenant), since, set(sessions), op.content_hash)

    def _record_freeze(self, product: str, kind: PromotionKind, before: str, after: str) -> None:
        self.twin.note_model_change(
            "bundle", self.products[product], f"{kind} promotions {before}", f"{kind} {after}"
        )

    def _compromised(self, t: _Tenant, ci: int) -> _Session:
        """The session an exfiltration runs in: the cell's oldest, or a new one; held open."""
        now = self.twin.t
        active = t.by_cell[ci]
        if active:
            s = min((t.sessions[k] for k in active), key=lambda x: (x.start_s, x.serial))
        else:
            model = int(np.argmax(self.twin.lam.reshape(len(self.twin.models), -1)[:, ci]))
            s = self._new_session(t, ci, model, now, math.inf)
            t.started[ci] += 1
            s.pinned_end_s = math.inf
            return s
        if s.pinned_end_s is None:
            s.pinned_end_s = s.end_s
            s.end_s = math.inf
        return s

    def _release(self, t: _Tenant, serial: int) -> None:
        s = t.sessions.get(serial)
        if s is None or s.pinned_end_s is None:
            return
        if any(ex.session == serial and ex.tenant == t.index for ex in self.exfil.values()):
            return  # another injection still holds it
        end = max(s.pinned_end_s, self.twin.t) if math.isfinite(s.pinned_end_s) else self.twin.t
        s.end_s, s.pinned_end_s = end, None
        heapq.heappush(t.ends, (end, serial))

    def _compensate(self, t: _Tenant, since: float, sessions: set[str], content_hash: str) -> None:
        now = self.twin.t
        for r in t.registered:
            if r.done or r.at_s < since:
                continue
            if sessions and r.session not in sessions:
                continue
            if content_hash and r.content_hash != content_hash:
                continue
            r.done = True
            t.compensations[0 if r.side_effect == "write" else 1] += 1
            self.compensation_log.append(
                CompensationRecord(
                    at_s=now,
                    tenant=t.name,
                    call_id=r.call_id,
                    session=r.session,
                    side_effect=r.side_effect,
                    completed_at_s=r.at_s,
                    content_hash=r.content_hash,
                )
            )

    # ------------------------------------------------------------------------------------------
    # reads: the audit log and what tests compare
    def egress_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> list[EgressRecord]:
        """Egress-proxy audit records in [start_s, end_s], oldest first (ties: as logged)."""
        ti = None if tenant is None else self._tenant(tenant).index
        twin = self.twin
        out: list[EgressRecord] = []
        for at, tj, s, ci, host, cls, decision in self.egress_log:
            if at < start_s or at > end_s or (ti is not None and tj != ti):
                continue
            out.append(
                EgressRecord(
                    at_s=at,
                    tenant=self.tenants[tj].name,
                    product=s.product,
                    session=s.id,
                    pod=s.pod,
                    cell=twin.cell_names[ci],
                    region=twin.region_names[twin.cell_region[ci]],
                    dest_host=host,
                    dest_class=cls,
                    decision=decision,
                )
            )
        out.sort(key=lambda r: r.at_s)
        return out

    def tool_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> list[ToolCallRecord]:
        """Tool-gateway audit records in [start_s, end_s], oldest first (ties: as logged)."""
        ti = None if tenant is None else self._tenant(tenant).index
        twin = self.twin
        out: list[ToolCallRecord] = []
        for at, tj, s, ci, number, tool, se, approved, outcome, toolset, h in self.tool_log:
            if at < start_s or at > end_s or (ti is not None and tj != ti):
                continue
            name = self.tenants[tj].name
            call_id = _call_id(name, number)
            out.append(
                ToolCallRecord(
                    at_s=at,
                    tenant=name,
                    product=s.product,
                    session=s.id,
                    pod=s.pod,
                    cell=twin.cell_names[ci],
                    region=twin.region_names[twin.cell_region[ci]],
                    call_id=call_id,
                    tool=tool,
                    side_effect=se,
                    args_hash="sha256:" + hashlib.sha256(f"{call_id}/{tool}".encode()).hexdigest(),
                    approved=approved,
                    approver=f"owner:{s.id}" if approved == "true" else "",
                    outcome=outcome,
                    toolset_digest=toolset,
                    content_hash=h,
                )
            )
        out.sort(key=lambda r: r.at_s)
        return out

    def compensations(self, *, tenant: str | None = None) -> list[CompensationRecord]:
        return [c for c in self.compensation_log if tenant is None or c.tenant == tenant]

    def complete_since_s(self) -> float:
        """Audit records from this time on are all still held (older ones may have rolled off)."""
        return max(self.egress_evicted_before_s, self.tool_evicted_before_s)

    def active_sessions(self, tenant: str) -> dict[str, str]:
        """Session id -> pod of a tenant's running sessions."""
        t = self._tenant(tenant)
        return {s.id: s.pod for s in sorted(t.sessions.values(), key=lambda s: s.serial)}

    def warm_pool(self, tenant: str) -> int:
        return self._tenant(tenant).pool

    def observable(self) -> dict[str, object]:
        """The state operations set (sessions and counters left out), as plain values."""
        return {
            "warm_pools": {t.name: t.pool for t in self.tenants},
            "exfil": {(e.tenant, e.cell): e.rate_per_s for e in self.exfil.values()},
            "prompts": {k: p.op for k, p in self.prompts.items()},
            "frozen": set(self.frozen),
            "blocked": {t.name: frozenset(t.blocked_hashes) for t in self.tenants},
            "toolsets": [b.toolset_digest for b in self.twin.bundle],
        }

    def tenant_snapshot(self, tenant: str) -> dict[str, object]:
        """Every number the tenant's sandboxes produced so far (for comparing runs)."""
        t = self._tenant(tenant)
        return {
            "sessions": sorted((s.id, s.cell, s.start_s, s.end_s) for s in t.sessions.values()),
            "started": t.started.tolist(),
            "rejected": t.rejected.tolist(),
            "connections": t.connections.tolist(),
            "calls": t.calls_counted.tolist(),
            "drops": t.drops.tolist(),
            "egress": self.egress_records(start_s=0.0, end_s=math.inf, tenant=tenant),
            "tools": self.tool_records(start_s=0.0, end_s=math.inf, tenant=tenant),
        }

    # ------------------------------------------------------------------------------------------
    # series
    def register_series(self, store: SeriesStore) -> None:
        twin = self.twin
        cells = [
            (c, twin.region_names[twin.cell_region[ci]]) for ci, c in enumerate(twin.cell_names)
        ]

        def per_cell(**extra: str) -> list[Labels]:
            return [
                labels_of(tenant=t.name, cell=c, region=r, **extra)
                for t in self.tenants
                for c, r in cells
            ]

        store.family(
            "firedrill_sandbox_connections_total",
            [
                labels_of(tenant=t.name, cell=c, region=r, dest_class=cls, decision=d)
                for t in self.tenants
                for c, r in cells
                for cls, d in CONNECTION_KINDS
            ],
        )
        store.family(
            "firedrill_toolgw_calls_total",
            [
                labels_of(tenant=t.name, cell=c, region=r, side_effect=se, approved=ap, outcome=oc)
                for t in self.tenants
                for c, r in cells
                for se, ap, oc in CALL_KINDS
            ],
        )
        store.family(
            "hubble_drop_total",
            [
                labels_of(namespace=t.namespace, cell=c, region=r, reason="POLICY_DENIED")
                for t in self.tenants
                for c, r in cells
            ],
        )
        store.family("firedrill_sandbox_sessions_active", per_cell())
        store.family("firedrill_sandbox_sessions_started_total", per_cell())
        store.family(
            "firedrill_sandbox_sessions_rejected_total", per_cell(reason="warm_pool_empty")
        )
        per_tenant = [labels_of(tenant=t.name) for t in self.tenants]
        store.family("firedrill_sandbox_warm_pool_replicas", per_tenant)
        store.family("firedrill_sandbox_pods_quarantined", per_tenant)
        store.family("firedrill_retrieval_blocked_total", per_tenant)
        store.family(
            "firedrill_toolgw_compensations_total",
            [
                labels_of(tenant=t.name, side_effect=se)
                for t in self.tenants
                for se in ("write", "money")
            ],
        )
        store.family(
            "firedrill_catalog_promotions_frozen",
            [labels_of(product=p, kind=k) for p in self.products for k in ("bundle", "toolset")],
        )

    def scrape(self, store: SeriesStore, k: int) -> None:
        ts = self.tenants
        c = self.counters
        store.write("firedrill_sandbox_connections_total", k, c.connections.reshape(-1))
        store.write("firedrill_toolgw_calls_total", k, c.calls_counted.reshape(-1))
        store.write("hubble_drop_total", k, c.drops.reshape(-1))
        store.write("firedrill_sandbox_sessions_active", k, c.sessions.reshape(-1).astype(float))
        store.write("firedrill_sandbox_sessions_started_total", k, c.started.reshape(-1))
        store.write("firedrill_sandbox_sessions_rejected_total", k, c.rejected.reshape(-1))
        store.write(
            "firedrill_sandbox_warm_pool_replicas", k, np.array([float(t.pool) for t in ts])
        )
        quarantined = self.twin.quarantined_pods
        store.write(
            "firedrill_sandbox_pods_quarantined",
            k,
            np.array(
                [
                    float(
                        sum(
                            1
                            for p, (ti, _) in self._pods.items()
                            if ti == t.index and p in quarantined
                        )
                    )
                    for t in ts
                ]
            )
            if quarantined
            else self._no_quarantine,
        )
        store.write(
            "firedrill_retrieval_blocked_total", k, np.array([t.retrieval_blocked for t in ts])
        )
        store.write("firedrill_toolgw_compensations_total", k, c.compensations.reshape(-1))
        store.write(
            "firedrill_catalog_promotions_frozen",
            k,
            np.array(
                [
                    float((p, kind) in self.frozen)
                    for p in self.products
                    for kind in ("bundle", "toolset")
                ]
            )
            if self.frozen
            else self._none_frozen,
        )


def _kind(kind: str) -> None:
    if kind not in ("bundle", "toolset"):
        raise OperationError(f"promotions are of kind bundle or toolset, not {kind!r}")


def _spread(start_s: float, dt: float, n: int) -> list[float]:
    """``n`` event times spread evenly over (start, start + dt], to the millisecond."""
    return [round(start_s + dt * (j + 1) / (n + 1), 3) for j in range(n)]


def _largest_remainder(counts: npt.NDArray[np.int64], total: int) -> npt.NDArray[np.int64]:
    """Share ``total`` among entries in proportion to ``counts`` (ties to the earlier entry)."""
    flat = counts.reshape(-1).astype(np.float64)
    want = flat * (total / flat.sum())
    out = np.floor(want).astype(np.int64)
    left = total - int(out.sum())
    if left > 0:
        order = np.lexsort((np.arange(flat.size), -(want - out)))
        out[order[:left]] += 1
    result: npt.NDArray[np.int64] = out.reshape(counts.shape)
    return result


__all__: Sequence[str] = ("SANDBOX_OPS", "SANDBOX_STEP_S", "SandboxSim")
