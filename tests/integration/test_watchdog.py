"""The supervisor's watchdog over embedded servers, with real child processes standing in for them."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import psutil
import pytest

from mnemesh.infra import EmbeddedProcess, Infrastructure, _spawn
from mnemesh.watchdog import Watchdog

pytestmark = pytest.mark.integration


def server(tmp_path: Path) -> EmbeddedProcess:
    return _spawn("redis", ["sleep", "300"], tmp_path)


async def test_a_killed_embedded_server_is_reaped_reported_and_started_again_after_its_backoff(
    tmp_path: Path,
) -> None:
    proc = server(tmp_path)
    said: list[str] = []
    dog = Watchdog(Infrastructure("redis://127.0.0.1:1/0", "postgresql://x@127.0.0.1:1/x", "-", [proc]),
                   say=said.append, probe_timeout=0.2)
    first = proc.process.pid
    try:
        proc.process.kill()
        with anyio.fail_after(5):
            while not said:
                dog.check_processes()
                await anyio.sleep(0.02)
        assert not psutil.pid_exists(first) or psutil.Process(first).status() != psutil.STATUS_ZOMBIE
        assert said == [f"  embedded redis was killed by SIGKILL; restart 1 in 0.5 s (log: {proc.log})"]
        with anyio.fail_after(5):
            while proc.process.pid == first:
                dog.check_processes()
                await anyio.sleep(0.05)
        assert proc.process.poll() is None
        assert (tmp_path / "run" / "redis.pid").read_text().split()[0] == str(proc.process.pid)
        problems = await dog.probe()
        status = dog.status()
    finally:
        proc.process.kill()
        proc.process.wait()
        await dog.aclose()
    assert sorted(problems) == ["postgres", "redis"]
    assert status["redis"]["restarts"] == 1 and status["redis"]["embedded"] and not status["redis"]["reachable"]
    assert not status["postgres"]["embedded"]


async def test_a_server_that_keeps_failing_waits_longer_each_time(tmp_path: Path) -> None:
    proc = _spawn("postgres", ["false"], tmp_path)
    said: list[str] = []
    dog = Watchdog(Infrastructure("redis://127.0.0.1:1/0", "postgresql://x@127.0.0.1:1/x", "-", [proc]),
                   say=said.append)
    try:
        deadline = time.monotonic() + 10
        while len([s for s in said if "restart" in s and " in " in s]) < 3:
            assert time.monotonic() < deadline, said
            dog.check_processes()
            await anyio.sleep(0.02)
    finally:
        await dog.aclose()
    delays = [s.split(" in ")[1].split(" s")[0] for s in said if "exited with code 1" in s]
    assert delays == ["0.5", "1.0", "2.0"]
