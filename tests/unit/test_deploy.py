"""The Kubernetes manifests (deploy/), checked offline: every kustomize overlay renders with
`kubectl kustomize` (no cluster needed), every rendered object validates against Kubernetes'
own OpenAPI schemas (the `kubernetes-validate` package, strict: an unknown or misspelt field
fails), the rendered config files pass `kqp check-config`, and the objects agree with each
other and with the config: ports, probes, labels, mounts, the fleet."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kqp.config import load_config

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(path.name for path in (REPO / "deploy/overlays").iterdir() if path.is_dir())
# The oldest Kubernetes release still supported upstream when this was written, and the newest
# the schemas know: the manifests must be valid on both.
KUBERNETES_VERSIONS = ("1.32", kubernetes_validate.latest_version())


def test_every_overlay_is_checked() -> None:
    assert OVERLAYS == ["plain", "tls-sni"]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object, as `kubectl kustomize` renders the overlay."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH: it renders the kustomize overlays (`kubectl kustomize`, no cluster "
                    "needed); the machine images ship it (Debian package kubectl)")
    output = subprocess.run([kubectl, "kustomize", str(REPO / "deploy/overlays" / request.param)],
                            capture_output=True, text=True, check=True, timeout=60).stdout
    objects = [document for document in yaml.safe_load_all(output) if document]
    by_name = {(item["kind"], item["metadata"]["name"]): item for item in objects}
    assert len(by_name) == len(objects), "two objects of one kind share a name"
    return by_name


def one(objects: dict[tuple[str, str], dict[str, Any]], kind: str, prefix: str = "kqp") -> dict[str, Any]:
    found = [item for (k, name), item in objects.items() if k == kind and name.startswith(prefix)]
    assert len(found) == 1, f"{kind} {prefix}*: {len(found)} found"
    return found[0]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_objects_validate_against_the_kubernetes_schemas(rendered: dict[tuple[str, str], dict[str, Any]],
                                                         version: str) -> None:
    assert {kind for kind, _ in rendered} == {"ConfigMap", "Service", "Deployment", "PodDisruptionBudget"}
    for item in rendered.values():
        kubernetes_validate.validate(item, version, strict=True)


def config_files(rendered: dict[tuple[str, str], dict[str, Any]], tmp_path: Path) -> list[Path]:
    """The files the container reads, in the order of its --config arguments, written out."""
    deployment = one(rendered, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]}
    args = container["args"]
    assert args[0] == "serve"
    paths = [args[i + 1] for i, arg in enumerate(args) if arg == "--config"]
    files = []
    for path in paths:
        directory, name = path.rsplit("/", 1)
        volume = volumes[mounts[directory]]
        config_map = rendered[("ConfigMap", volume["configMap"]["name"])]
        target = tmp_path / f"{len(files)}-{name}"
        target.write_text(config_map["data"][name])
        files.append(target)
    return files


def test_the_rendered_config_passes_check_config(rendered: dict[tuple[str, str], dict[str, Any]],
                                                 tmp_path: Path) -> None:
    files = config_files(rendered, tmp_path)
    assert len(files) == 3
    result = subprocess.run([sys.executable, "-m", "kqp", "check-config", *map(str, files)],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("OK: ")
    # The quota file alone, as an operator checks an edit of the ConfigMap.
    (quotas,) = [f for f in files if f.name.endswith("quotas.yaml")]
    alone = subprocess.run([sys.executable, "-m", "kqp", "check-config", str(quotas)],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert alone.returncode == 0, alone.stderr


def test_objects_agree_with_each_other_and_the_config(rendered: dict[tuple[str, str], dict[str, Any]],
                                                     tmp_path: Path) -> None:
    config = load_config(config_files(rendered, tmp_path))
    deployment = one(rendered, "Deployment")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    labels = pod["metadata"]["labels"]

    # N instances enforcing one budget.
    assert deployment["spec"]["replicas"] >= 2
    assert config.fleet.enabled
    # Selectors of the Deployment, the Services and the PDB pick exactly these pods.
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    assert one(rendered, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == labels
    for kind, name in rendered:
        if kind == "Service":
            assert rendered[(kind, name)]["spec"]["selector"] == labels, name

    # Ports: what kqp listens on is what the container declares and the client Service forwards.
    container_ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert container_ports["metrics"] == config.metrics.port
    assert config.metrics.host == "0.0.0.0" and config.proxy.bind_host == "0.0.0.0"
    assert container_ports["bootstrap"] == config.proxy.bootstrap_port
    client_service = rendered[("Service", "kqp")]
    targets = {port["targetPort"] for port in client_service["spec"]["ports"]}
    assert targets <= set(container_ports)
    if config.proxy.sni_routing is None:
        brokers = {name: port for name, port in container_ports.items() if name.startswith("broker-")}
        assert brokers, "no broker port"
        for name, port in brokers.items():
            node = int(name.removeprefix("broker-"))
            assert port == config.proxy.node_ports.get(node, config.proxy.node_port_base + node)
        assert targets == {"bootstrap", *brokers}
        assert config.proxy.advertised_host.startswith("kqp.")  # the client Service's DNS name
    else:
        (port,) = client_service["spec"]["ports"]
        assert port["port"] == config.proxy.sni_routing.advertised_port
        assert set(container_ports) == {"bootstrap", "metrics"}
        assert config.proxy.tls is not None
        tls_mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "tls")
        assert config.proxy.tls.cert_file.startswith(tls_mount + "/")

    # Probes on the endpoints kqp serves; Prometheus scrapes where /metrics is.
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == config.metrics.port
    assert annotations["prometheus.io/path"] == "/metrics"

    # Not root, nothing to escalate to; requests sized, memory bounded.
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    # A drain finishes what is in flight before the kubelet kills the pod.
    assert pod["spec"]["terminationGracePeriodSeconds"] > config.proxy.shutdown_grace_seconds + 5


def test_the_quota_configmap_updates_in_place(rendered: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Live reload needs the kubelet to update the mounted files: the quota ConfigMap keeps its
    name (no content hash), and is mounted as a directory (a subPath mount never updates)."""
    assert ("ConfigMap", "kqp-quotas") in rendered
    container = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert all("subPath" not in mount for mount in container["volumeMounts"])


def test_a_new_user_finds_the_deploy_page() -> None:
    page = REPO / "docs/deploy.md"
    assert page.is_file()
    assert "docs/deploy.md" in (REPO / "README.md").read_text()
    # Every overlay the page names exists, and every overlay is named.
    named = set(re.findall(r"overlays/([a-z-]+)", page.read_text()))
    assert named == set(OVERLAYS)
