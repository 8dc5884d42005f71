"""Weights supply chain: regional origin (registry/bucket), node NICs and peer-to-peer.

A fluid model per step over the active pulls (a pull is one node fetching one digest):

* each pulling node asks for its NIC's line rate (north-south, GB/s);
* a share ``h`` of its bytes comes from peers in the region that hold the digest (whole or in part,
  as piece-sharing P2P does); ``h = max_hit · H / (H + half_saturation)`` where H counts holders
  (a partial holder counts as its fraction), so the hit rate grows with the digest's spread;
* the swarm has real limits. **Upload**: each holder seeds at most ``p2p_upload_gbytes_per_s``
  (a partial holder in proportion to what it holds), so the peers of a region serve one digest at
  most ``upload × H`` in total, shared by its pullers. **Piece availability**: ``max_hit`` is the
  share of a digest's pieces the swarm can hold at all (the rest — the newest, the rarest — only
  the origin has), so at any moment a pull has taken at most ``max_hit`` of the bytes it moved
  from peers: a pull whose origin is slow or cut is held back with it, and the hit rate never
  exceeds its bound;
* the rest goes to the regional origin, which serves at most ``origin_gbytes_per_s`` and at most
  ``max_requests_per_s × prefixes`` ranged GETs of ``range_mb``. Demand beyond the request rate is
  answered 503 SlowDown, beyond bandwidth 429, and every origin-bound byte is slowed by the same
  factor. A client keeps ``parallel_gets`` GETs open and backs off ``retry_backoff_s`` after a
  rejection, so the origin logs at most ``parallel_gets / retry_backoff_s`` rejections per
  client per second, not the whole unmet demand again every second.

300 nodes × 140 GB from a 100 GB/s origin with no P2P take 42 TB / 100 GB/s = 420 s of transfer.

Pulls on one node split its NIC. Competing pullers (batch/eval jobs, ``twin/pullers.py``) pull
negative digests: they share the origin and the NICs, their bytes are counted apart, and they
never satisfy a serving replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from firedrill.model.spec import RegistrySpec

F64 = npt.NDArray[np.float64]


@dataclass
class RegionSupply:
    spec: RegistrySpec
    origin_gb: float = 0.0
    p2p_gb: float = 0.0
    errors_503: float = 0.0
    errors_429: float = 0.0
    peak_gbps_per_node: float = 0.0
    interval_peak_gbps_per_node: float = 0.0  # since the last scrape (the scrape resets it)
    pull_seconds: float = 0.0  # node-seconds spent pulling serving weights
    competing_origin_gb: float = 0.0  # bytes pulled by competing pullers (negative digests)
    competing_p2p_gb: float = 0.0
    holders: dict[int, int] = field(default_factory=dict)  # digest -> nodes holding it whole


@dataclass
class Pull:
    node: int
    region: int
    digest: int
    total_gb: float
    remaining_gb: float
    started_s: float
    peer_gb: float = 0.0  # bytes this pull got from peers
    origin_gb: float = 0.0  # bytes this pull got from the origin


class Supply:
    def __init__(self, registries: list[RegistrySpec]) -> None:
        self.regions = [RegionSupply(spec=r) for r in registries]
        self.pulls: dict[tuple[int, int], Pull] = {}
        self.last_rate_gbps: dict[tuple[int, int], float] = {}

    def add_holder(self, region: int, digest: int, n: int = 1) -> None:
        h = self.regions[region].holders
        h[digest] = h.get(digest, 0) + n

    def remove_holder(self, region: int, digest: int) -> None:
        h = self.regions[region].holders
        if h.get(digest, 0) > 0:
            h[digest] -= 1

    def start(self, node: int, region: int, digest: int, size_gb: float, now_s: float) -> None:
        key = (node, digest)
        if key not in self.pulls:
            self.pulls[key] = Pull(node, region, digest, size_gb, size_gb, now_s)

    def cancel_node(self, node: int) -> None:
        for key in [k for k in self.pulls if k[0] == node]:
            del self.pulls[key]

    def step(
        self,
        dt_s: float,
        nic_gbps: F64,
        origin_ok: npt.NDArray[np.bool_],
        available: set[tuple[int, int]],
    ) -> list[Pull]:
        """Advance every pull by ``dt_s``; return the pulls that completed.

        ``nic_gbps`` is GB/s per node, ``origin_ok`` per node (False when its cell is cut from the
        registry), ``available`` the (region, digest) pairs published in a region's registry.
        """
        if not self.pulls:
            return []
        pulls = list(self.pulls.values())
        node = np.fromiter((p.node for p in pulls), dtype=np.int64, count=len(pulls))
        region = np.fromiter((p.region for p in pulls), dtype=np.int64, count=len(pulls))
        digest = np.fromiter((p.digest for p in pulls), dtype=np.int64, count=len(pulls))
        remaining = np.fromiter((p.remaining_gb for p in pulls), dtype=np.float64, count=len(pulls))
        total = np.fromiter((p.total_gb for p in pulls), dtype=np.float64, count=len(pulls))
        peer_got = np.fromiter((p.peer_gb for p in pulls), dtype=np.float64, count=len(pulls))
        origin_got = np.fromiter((p.origin_gb for p in pulls), dtype=np.float64, count=len(pulls))
        max_hits = np.zeros(len(pulls))
        want = nic_gbps[node]
        if len(pulls) > 1:  # pulls on one node share its NIC (a competing puller, say)
            per_node = np.bincount(node)[node]
            if per_node.max() > 1:
                want = want / per_node
        hit = np.zeros(len(pulls))
        swarm_gbps = np.zeros(len(pulls))  # the upload of the pull's swarm (region, digest)
        for r_idx, rs in enumerate(self.regions):
            in_r = region == r_idx
            if not in_r.any() or not rs.spec.p2p:
                continue
            max_hit = rs.spec.p2p_max_hit_rate
            for d in np.unique(digest[in_r]):
                grp = in_r & (digest == d)
                partial = float(np.sum(1.0 - remaining[grp] / total[grp]))
                holders = rs.holders.get(int(d), 0) + partial
                hit[grp] = max_hit * holders / (holders + rs.spec.p2p_half_saturation_nodes)
                swarm_gbps[grp] = rs.spec.p2p_upload_gbytes_per_s * holders
                max_hits[grp] = max_hit
        can_origin = origin_ok[node] & np.fromiter(
            # competing pullers (negative digests) pull what the registry already holds
            (d < 0 or (int(r), int(d)) in available for r, d in zip(region, digest, strict=True)),
            dtype=bool,
            count=len(pulls),
        )
        # the peers' share, bounded by the swarm's upload (shared in proportion to what each pull
        # asks of it); the pieces the swarm can hold bound it again below
        peer_want = hit * want
        for key in {(int(r), int(d)) for r, d in zip(region, digest, strict=True)}:
            grp = (region == key[0]) & (digest == key[1])
            asked = float(peer_want[grp].sum())
            upload = float(swarm_gbps[grp][0]) if grp.any() else 0.0
            if asked > upload > 0:
                peer_want[grp] *= upload / asked
        peer_rate = peer_want
        # the origin: what the peers do not serve, for a node that can reach it
        origin_want = np.where(can_origin, np.maximum(want - peer_rate, 0.0), 0.0)
        scale = np.ones(len(pulls))
        for r_idx, rs in enumerate(self.regions):
            in_r = region == r_idx
            demand = float(origin_want[in_r].sum())
            if demand <= 0:
                continue
            gets_wanted = demand * 1000.0 / rs.spec.range_mb
            get_cap = rs.spec.max_requests_per_s * rs.spec.prefixes
            bw_cap = rs.spec.origin_gbytes_per_s
            served = min(demand, bw_cap, get_cap * rs.spec.range_mb / 1000.0)
            # rejections as the origin logs them: each client retries a rejected GET only after
            # its back-off, so at most parallel_gets / backoff per client per second
            clients = float(np.count_nonzero(in_r & (origin_want > 0)))
            retry_cap = clients * rs.spec.parallel_gets / rs.spec.retry_backoff_s
            slow_down = max(gets_wanted - get_cap, 0.0)  # GET/s answered 503
            too_many = max(demand - bw_cap, 0.0) * 1000.0 / rs.spec.range_mb  # GET/s answered 429
            rejected = slow_down + too_many
            if rejected > retry_cap:
                slow_down, too_many = (x * retry_cap / rejected for x in (slow_down, too_many))
            rs.errors_503 += slow_down * dt_s
            rs.errors_429 += too_many * dt_s
            scale[in_r] = served / demand
        origin_rate = origin_want * scale
        # piece availability: a pull's bytes from peers stay within max_hit of all it has moved
        # (peer ≤ ratio × origin, ratio = max_hit / (1 - max_hit)), so a pull whose origin is slow
        # or cut is held back with it, and the hit rate never exceeds its bound
        origin_step = origin_rate * dt_s
        peer_step = peer_rate * dt_s
        ratio = np.where(max_hits < 1.0, max_hits / np.maximum(1.0 - max_hits, 1e-12), np.inf)
        room = np.where(np.isinf(ratio), np.inf, ratio * (origin_got + origin_step) - peer_got)
        peer_step = np.clip(np.minimum(peer_step, room), 0.0, None)
        step_gb = origin_step + peer_step
        shrink = np.where(step_gb > remaining, remaining / np.maximum(step_gb, 1e-12), 1.0)
        origin_moved = origin_step * shrink
        peer_moved = peer_step * shrink
        moved = origin_moved + peer_moved
        rate = moved / dt_s  # GB/s per pull, as achieved
        done: list[Pull] = []
        for i, p in enumerate(pulls):
            rs = self.regions[p.region]
            if p.digest < 0:
                rs.competing_origin_gb += float(origin_moved[i])
                rs.competing_p2p_gb += float(peer_moved[i])
            else:
                rs.origin_gb += float(origin_moved[i])
                rs.p2p_gb += float(peer_moved[i])
                rs.pull_seconds += dt_s
                rs.peak_gbps_per_node = max(rs.peak_gbps_per_node, float(rate[i]))
                rs.interval_peak_gbps_per_node = max(rs.interval_peak_gbps_per_node, float(rate[i]))
            self.last_rate_gbps[(p.node, p.digest)] = float(rate[i])
            p.peer_gb += float(peer_moved[i])
            p.origin_gb += float(origin_moved[i])
            p.remaining_gb -= float(moved[i])
            if p.remaining_gb <= 1e-9:
                done.append(p)
                del self.pulls[(p.node, p.digest)]
                self.last_rate_gbps.pop((p.node, p.digest), None)
        return done
