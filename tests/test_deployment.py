"""The deployment files: docker-compose.yml and the Kubernetes manifests render and hold together."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from libs.config import SERVICES

ROOT = Path(__file__).resolve().parent.parent


def compose_available() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not compose_available(), reason="needs the docker client with its compose plugin")
def test_docker_compose_config_validates() -> None:
    result = subprocess.run(["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_compose_runs_the_real_infrastructure_and_every_service_with_health_checks() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    images = " ".join(str(s.get("image", "")) for s in services.values())
    for part in ("redis:7", "pgvector/pgvector:pg16", "qdrant/qdrant", "opentelemetry-collector"):
        assert part in images, f"{part} missing from docker-compose.yml"
    for name, ports in SERVICES.items():
        service = services[name]
        assert service["command"] == ["serve", name]
        assert "healthcheck" in service, f"{name} has no healthcheck"
        assert any(str(ports.grpc) in str(p) for p in service.get("ports", [])), f"{name} does not publish its port"
        assert {"redis", "postgres"} <= set(service["depends_on"]), f"{name} does not wait for its infrastructure"


@pytest.mark.skipif(not shutil.which("kubectl"), reason="needs kubectl for kustomize")
def test_kubernetes_manifests_render_with_probes_budgets_and_autoscaling() -> None:
    result = subprocess.run(["kubectl", "kustomize", str(ROOT / "infra/k8s/base")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for name in SERVICES:
        for kind in ("Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"):
            assert (kind, name) in kinds, f"{kind} {name} missing"
    assert any(kind == "NetworkPolicy" for kind, _ in kinds)
    for d in docs:
        if d["kind"] == "Deployment":
            container = d["spec"]["template"]["spec"]["containers"][0]
            assert {"livenessProbe", "readinessProbe", "resources"} <= set(container), d["metadata"]["name"]


def acl_users() -> dict[str, str]:
    """user -> password of infra/redis/users.acl."""
    return dict(re.findall(r"^user (\S+) on >(\S+)", (ROOT / "infra/redis/users.acl").read_text(), re.MULTILINE))


def test_compose_runs_redis_with_the_acl_file_and_each_service_as_its_own_user() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    redis = compose["services"]["redis"]
    assert "--aclfile" in redis["command"]
    assert any(v.startswith("./infra/redis/users.acl:") for v in redis["volumes"])
    users = acl_users()
    for name in SERVICES:
        url = urlsplit(compose["services"][name]["environment"]["REDIS_URL"])
        assert url.username == name, f"{name} connects to Redis as {url.username!r}, not as its own user"
        assert users.get(name) == url.password, f"{name}'s REDIS_URL password does not match infra/redis/users.acl"


def test_kubernetes_secret_gives_each_service_its_own_redis_user() -> None:
    secret = yaml.safe_load((ROOT / "infra/k8s/base/redis-users.yaml").read_text())
    users = acl_users()
    for name in SERVICES:
        url = urlsplit(secret["stringData"][name])
        assert (url.username, url.password) == (name, users.get(name)), f"{name} in redis-users.yaml"
    assert "REDIS_URL=" not in (ROOT / "infra/k8s/base/common.env").read_text()  # no shared, all-powerful URL
