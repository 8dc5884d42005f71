"""What ``rules generate`` writes for prometheus-operator, held to the upstream CRDs.

The PrometheusRule, the ServiceMonitor (vLLM) and the PodMonitor (dcgm-exporter) are validated
against their CRD's ``openAPIV3Schema`` (``tests/export/crds``, byte-for-byte upstream) strictly,
as the apiserver's strict field validation does: a field the schema does not declare fails.
The alertmanager.yml with every kind of receiver goes through amtool.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.detect.alertmanager import (
    FIREDRILL_SERVE_WEBHOOK,
    PagerDuty,
    Receiver,
    Receivers,
    RoutingSpec,
    Slack,
    alertmanager_config,
    alertmanager_yaml,
)
from firedrill.detect.slo import ScrapeSpec
from firedrill.export.monitors import meta_label, pod_monitor, service_monitor

ROOT = Path(__file__).resolve().parents[2]
CRDS = Path(__file__).parent / "crds"


def _strict(schema: Any) -> Any:
    """``additionalProperties: false`` wherever properties are declared and unknown fields are
    not preserved (``x-kubernetes-preserve-unknown-fields``); RE2 flag groups moved for Python."""
    out = copy.deepcopy(schema)
    stack = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str) and pattern.startswith("^(?i)"):
                # Go's RE2 takes a flag group anywhere; Python only at the start.
                node["pattern"] = "(?i)^" + pattern.removeprefix("^(?i)")
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def crd_validator(file: str, version: str = "v1") -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((CRDS / file).read_text())
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _strict(v["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _errors(validator: jsonschema.Draft7Validator, doc: Any) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rules")
    result = CliRunner().invoke(
        app, ["rules", "generate", str(ROOT / "examples/slo.yaml"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "twin-only groups included" in result.output
    return out


@pytest.mark.parametrize(
    ("file", "crd"),
    [
        ("prometheusrule.yaml", "monitoring.coreos.com_prometheusrules.yaml"),
        ("servicemonitor-vllm.yaml", "monitoring.coreos.com_servicemonitors.yaml"),
        ("podmonitor-dcgm-exporter.yaml", "monitoring.coreos.com_podmonitors.yaml"),
    ],
)
def test_generated_manifests_fit_the_upstream_crds(generated: Path, file: str, crd: str) -> None:
    doc = yaml.safe_load((generated / file).read_text())
    assert _errors(crd_validator(crd), doc) == []
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"


def test_the_crd_check_catches_a_broken_manifest() -> None:
    sm = service_monitor(ScrapeSpec())
    bad = copy.deepcopy(sm)
    bad["spec"]["endpoints"][0]["relabelings"][0]["targetLable"] = "cell"  # a typo
    assert any("targetLable" in e for e in _errors(crd_validator(CRDS_SM), bad))
    bad = copy.deepcopy(sm)
    bad["spec"]["endpoints"][0]["relabelings"][0]["action"] = "rename"
    assert _errors(crd_validator(CRDS_SM), bad)


CRDS_SM = "monitoring.coreos.com_servicemonitors.yaml"


def test_monitors_copy_cell_and_region_from_the_node() -> None:
    scrape = ScrapeSpec(cell_node_label="example.com/cell")
    sm = service_monitor(scrape)
    pm = pod_monitor(scrape)
    for spec, endpoint in (
        (sm["spec"], sm["spec"]["endpoints"][0]),
        (pm["spec"], pm["spec"]["podMetricsEndpoints"][0]),
    ):
        assert spec["attachMetadata"] == {"node": True}
        targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        assert targets["cell"] == ["__meta_kubernetes_node_label_example_com_cell"]
        assert targets["region"] == ["__meta_kubernetes_node_label_topology_kubernetes_io_region"]
        assert endpoint["honorLabels"] is False
    # Only vLLM's http_* series (no model_name of their own) get the pod's served model.
    first, drop = sm["spec"]["endpoints"][0]["metricRelabelings"]
    assert first["sourceLabels"] == ["model_name", "firedrill_served_model"]
    assert first["regex"] == ";(.+)"
    assert drop == {"action": "labeldrop", "regex": "firedrill_served_model"}
    assert meta_label("pod_annotation", "firedrill.dev/served-model-name") == (
        "__meta_kubernetes_pod_annotation_firedrill_dev_served_model_name"
    )


def test_receivers_default_to_firedrill_serve_and_warn(tmp_path: Path) -> None:
    cfg = alertmanager_config(RoutingSpec())
    for r in cfg["receivers"]:
        assert r["webhook_configs"] == [{"url": FIREDRILL_SERVE_WEBHOOK, "send_resolved": True}]
    assert FIREDRILL_SERVE_WEBHOOK.endswith("/api/v1/alerts/webhook")
    slo = tmp_path / "slo.yaml"
    slo.write_text(
        "objectives: [{name: a, product: chat, model: m, sli: availability}]\n"
        "routing:\n  receivers:\n    page: {pagerduty: {routing_key_file: /etc/am/pd}}\n"
    )
    result = CliRunner().invoke(app, ["rules", "generate", str(slo), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "placeholder receivers" not in result.output
    assert "twin-only groups" in result.output
    quiet = tmp_path / "quiet.yaml"
    quiet.write_text("objectives: [{name: a, product: chat, model: m, sli: availability}]\n")
    result = CliRunner().invoke(app, ["rules", "generate", str(quiet), "--out", str(tmp_path)])
    assert "placeholder receivers" in result.output


def test_every_kind_of_receiver_passes_amtool(tmp_path: Path) -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail("amtool not found; install prometheus-alertmanager", pytrace=False)
    routing = RoutingSpec(
        receivers=Receivers(
            page=Receiver(
                webhook_urls=[FIREDRILL_SERVE_WEBHOOK],
                bearer_token_file="/etc/firedrill/alertmanager-token",
                pagerduty=PagerDuty(routing_key_file="/etc/alertmanager/pagerduty-key"),
            ),
            ticket=Receiver(
                webhook_urls=[],
                slack=Slack(api_url_file="/etc/alertmanager/slack-url", channel="#gpu-fleet"),
            ),
            security=Receiver(
                pagerduty=PagerDuty(routing_key_file="/etc/alertmanager/pd-security"),
                slack=Slack(api_url_file="/etc/alertmanager/slack-url", channel="#security"),
            ),
        )
    )
    path = tmp_path / "alertmanager.yml"
    path.write_text(alertmanager_yaml(routing))
    result = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    receivers = {r["name"]: r for r in yaml.safe_load(path.read_text())["receivers"]}
    auth = receivers["page"]["webhook_configs"][0]["http_config"]["authorization"]
    assert auth == {"type": "Bearer", "credentials_file": "/etc/firedrill/alertmanager-token"}
    assert "webhook_configs" not in receivers["ticket"]
    assert set(receivers["security"]) == {"name", "webhook_configs", "pagerduty_configs",
                                          "slack_configs"}  # fmt: skip


def test_a_receiver_must_go_somewhere() -> None:
    with pytest.raises(ValueError, match="needs a webhook URL"):
        Receiver(webhook_urls=[])


def _snake(relabel: dict[str, Any]) -> dict[str, Any]:
    """A prometheus-operator RelabelConfig as Prometheus's own ``relabel_config``."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(k, k): v for k, v in relabel.items()}


def test_a_real_prometheus_gives_vllm_http_series_the_served_model(tmp_path: Path) -> None:
    """The ServiceMonitor's metric relabeling, run by Prometheus itself on what a vLLM pod
    exposes, with the target labels its relabelings would have made from the pod and node."""
    from firedrill.adapters.metrics_server import MetricsServer
    from tests.adapters.test_twin_serve import (
        free_port,
        get,
        prometheus_binary,
        stop_process,
        wait_for,
    )

    exposed = (
        "# TYPE http_requests_total counter\n"
        'http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 7\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="own-name"} 3\n'
    )
    endpoint = service_monitor(ScrapeSpec())["spec"]["endpoints"][0]
    with MetricsServer(lambda: exposed) as pod:
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "vllm",
                    "static_configs": [
                        {
                            "targets": [pod.url.removeprefix("http://")],
                            # what the relabelings make of the node's labels and the annotation
                            "labels": {
                                "cell": "use1-a",
                                "region": "us-east-1",
                                "firedrill_served_model": "llm-70b",
                            },
                        }
                    ],
                    "metric_relabel_configs": [_snake(r) for r in endpoint["metricRelabelings"]],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        url = f"http://127.0.0.1:{free_port()}"
        with (tmp_path / "prometheus.log").open("wb") as log:
            process = subprocess.Popen(
                [
                    prometheus_binary(),
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address={url.removeprefix('http://')}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:

            def query(promql: str) -> list[dict[str, Any]]:
                try:
                    status, _, body = get(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}")
                except OSError:  # not listening yet
                    return []
                if status != 200:
                    return []
                result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
                return result

            wait_for("both series scraped", lambda: len(query('{job="vllm", cell="use1-a"}')) >= 2)
            (http,) = query("http_requests_total")
            (engine,) = query("vllm:num_requests_running")
        finally:
            stop_process(process)
    assert http["metric"]["model_name"] == "llm-70b"
    assert engine["metric"]["model_name"] == "own-name"  # vLLM's own label wins
    for series in (http, engine):
        assert "firedrill_served_model" not in series["metric"]
        assert series["metric"]["region"] == "us-east-1"
