"""A lightkube ``Client`` whose every request passes through a ``RecordingTransport``.

In a cluster the inner transport is httpx2's own, with the TLS context lightkube derives from
the kubeconfig or the service account (client certificates included); in tests it is an
``httpx2.MockTransport`` that answers like an apiserver. Either way the adapter sees the same
``ApiCall`` records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx2
from lightkube import Client
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import KubeConfig, SingleConfig

from firedrill.adapters.kubernetes.transport import ApiCall, RecordingTransport

__all__ = ["Connection", "connect", "replay_config"]


@dataclass(frozen=True)
class Connection:
    client: Client
    transport: RecordingTransport


def replay_config(server: str = "https://apiserver.invalid", token: str = "test") -> KubeConfig:
    """A kubeconfig naming one cluster and a bearer token (for a replaying transport)."""
    return KubeConfig.from_dict(
        {
            "current-context": "firedrill",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "contexts": [{"name": "firedrill", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": token}}],
        }
    )


def connect(
    config: KubeConfig | SingleConfig | Path | None = None,
    *,
    context: str | None = None,
    transport: httpx2.BaseTransport | None = None,
    field_manager: str = "firedrill",
    timeout_s: float = 10.0,
    listener: Callable[[ApiCall], None] | None = None,
    keep_calls: int | None = None,
) -> Connection:
    """A client on ``config`` (a kubeconfig file, or the environment's kubeconfig or service
    account by default)."""
    if config is None:
        config = KubeConfig.from_env()
    elif isinstance(config, Path):
        config = KubeConfig.from_file(config)
    single = config.get(context) if isinstance(config, KubeConfig) else config
    if single is None:
        raise ValueError(f"no kubeconfig context {context!r}")
    if transport is None:
        assert single.user is not None
        verify = verify_cluster(single.cluster, single.user, single.abs_file)
        transport = httpx2.HTTPTransport(verify=verify)
    recording = RecordingTransport(transport, listener, keep=keep_calls)
    client = Client(
        single,
        transport=recording,
        trust_env=False,
        field_manager=field_manager,
        timeout=httpx2.Timeout(timeout_s),
    )
    return Connection(client, recording)
