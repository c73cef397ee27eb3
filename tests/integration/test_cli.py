"""The CLI's answers to bad configuration and missing infrastructure: which setting, and what to do."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from libs.config import SERVICES
from mnemesh.infra import free_port

pytestmark = pytest.mark.integration


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mnemesh(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "QDRANT_URL")
             and not k.startswith("MNEMESH_")}
    return subprocess.run([sys.executable, "-m", "mnemesh", *args], env={**clean, **env}, capture_output=True,
                          text=True, timeout=60)


def test_an_invalid_setting_stops_the_service_naming_the_setting() -> None:
    result = mnemesh("serve", "retriever", MNEMESH_RETRIEVER_GRPC_PORT="abc")
    assert result.returncode == 2
    assert "MNEMESH_RETRIEVER_GRPC_PORT='abc'" in result.stderr and "integer" in result.stderr


def test_a_short_jwt_secret_is_refused_at_start() -> None:
    result = mnemesh("serve", "orchestrator", MNEMESH_JWT_SECRET="short")
    assert result.returncode == 2 and "MNEMESH_JWT_SECRET" in result.stderr and "32 bytes" in result.stderr


def test_a_service_without_redis_says_what_to_set() -> None:
    result = mnemesh("serve", "memory-writer", MNEMESH_METRICS_ENABLED="false")
    assert result.returncode == 2
    assert "REDIS_URL is not set" in result.stderr and "mnemesh run" in result.stderr


def test_unreachable_postgresql_is_named_with_the_setting_to_fix(redis_url: str) -> None:
    result = mnemesh("serve", "memory-writer", REDIS_URL=redis_url, MNEMESH_METRICS_ENABLED="false",
                     DATABASE_URL=f"postgresql://postgres@127.0.0.1:{closed_port()}/nowhere")
    assert result.returncode == 2
    assert "cannot reach PostgreSQL" in result.stderr and "DATABASE_URL" in result.stderr


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_a_service_runs_on_the_event_loop_its_setting_names(choice: str, redis_url: str) -> None:
    # The loop is logged right after logging starts, before the infrastructure check stops this one.
    result = mnemesh("serve", "memory-writer", REDIS_URL=redis_url, MNEMESH_METRICS_ENABLED="false",
                     MNEMESH_EVENT_LOOP=choice, DATABASE_URL=f"postgresql://postgres@127.0.0.1:{closed_port()}/x")
    assert result.returncode == 2
    loops = [json.loads(line)["loop"] for line in result.stderr.splitlines()
             if line.startswith("{") and json.loads(line).get("event") == "event loop"]
    assert loops == [choice]


def test_status_without_a_running_mesh_says_how_to_start_one(tmp_path) -> None:
    result = mnemesh("status", MNEMESH_DATA_DIR=str(tmp_path))
    assert result.returncode == 1 and "make run" in result.stdout


def test_a_busy_metrics_port_names_the_setting(redis_url: str, database_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = mnemesh("serve", "adapter", REDIS_URL=redis_url, DATABASE_URL=database_url,
                         MNEMESH_ADAPTER_METRICS_PORT=str(port))
    assert result.returncode == 2 and "MNEMESH_ADAPTER_METRICS_PORT" in result.stderr


def test_run_with_an_unreachable_configured_redis_stops_before_starting_services(database_url: str, tmp_path) -> None:
    # Ports of their own, so that a mesh running elsewhere on this machine cannot be what stops it.
    ports = {f"MNEMESH_{s.upper().replace('-', '_')}_{kind}_PORT": str(free_port())
             for s in SERVICES for kind in ("GRPC", "METRICS")}
    result = mnemesh("run", "--dev", REDIS_URL=f"redis://127.0.0.1:{closed_port()}/0", DATABASE_URL=database_url,
                     MNEMESH_DATA_DIR=str(tmp_path), MNEMESH_MCP_HTTP_PORT=str(free_port()), **ports)
    assert result.returncode == 1
    assert "cannot start the mesh: cannot reach Redis" in result.stderr and "REDIS_URL" in result.stderr
    assert "starting memory-writer" not in result.stdout


def test_run_refuses_the_published_secret_unless_in_development_mode(tmp_path) -> None:
    result = mnemesh("run", MNEMESH_DATA_DIR=str(tmp_path))
    assert result.returncode == 2
    assert "MNEMESH_JWT_SECRET" in result.stderr and "mnemesh run --dev" in result.stderr


def test_the_write_bench_without_a_running_writer_says_how_to_start_one(redis_url: str, database_url: str) -> None:
    port = closed_port()
    result = mnemesh("bench", "write", "--n", "10", REDIS_URL=redis_url, DATABASE_URL=database_url,
                     MNEMESH_DEV_MODE="true", MNEMESH_MEMORY_WRITER_GRPC_PORT=str(port))
    assert result.returncode == 2
    assert f"no memory-writer serving at 127.0.0.1:{port}" in result.stderr and "make run" in result.stderr
