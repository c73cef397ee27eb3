"""`mnemesh run` keeps its embedded Redis and PostgreSQL alive, and knows whether they answer.

An embedded server that exits (a crash, the OOM killer, a SIGKILL) is reaped at once (no
<defunct> left behind), reported, and started again on its own backoff: 0.5, 1, 2 ... 30 s,
back to 0.5 s once it has run a minute. Its data survives: Redis appends and fsyncs every
write, PostgreSQL recovers from its WAL. A PostgreSQL killed hard may refuse to start until
its orphaned backends have exited, so the rest of its process group is killed before the restart.

Every dependency, embedded or configured, is probed as the services probe it
(libs/readiness.py); `mnemesh status` shows the result the supervisor last wrote.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from libs.config import redacted
from libs.readiness import Probe, close_probes, postgres_probe, probe_all, redis_probe
from mnemesh.infra import EmbeddedProcess, Infrastructure

__all__ = ["Watchdog"]

_NAMES = {"redis": "redis", "postgres": "postgres"}  # embedded process name -> dependency name


def _exit_text(code: int) -> str:
    if code < 0:
        with_name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return f"was killed by {with_name}"
    return f"exited with code {code}"


@dataclass
class _Watched:
    proc: EmbeddedProcess
    started_at: float
    restarts: int = 0
    failures_in_a_row: int = 0
    restart_at: float | None = None
    orphans_deadline: float = 0.0


@dataclass
class Watchdog:
    infra: Infrastructure
    say: Callable[[str], None] = print
    probe_timeout: float = 2.0
    watched: dict[str, _Watched] = field(default_factory=dict)
    probes: dict[str, Probe] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    checked_at: float = 0.0

    def __post_init__(self) -> None:
        now = time.monotonic()
        self.watched = {p.name: _Watched(p, now) for p in self.infra.processes}
        self.probes = {"redis": redis_probe(self.infra.redis_url, self.probe_timeout),
                       "postgres": postgres_probe(self.infra.database_url, self.probe_timeout)}

    def check_processes(self) -> None:
        """Reap embedded servers that exited, and start again those whose backoff has passed."""
        now = time.monotonic()
        for w in self.watched.values():
            if w.restart_at is not None:
                if now >= w.restart_at and not w.proc.kill_orphans() and now < w.orphans_deadline:
                    w.restart_at = now + 0.2  # its orphans are still exiting: start once they are gone
                elif now >= w.restart_at:
                    w.proc.respawn()
                    w.started_at, w.restart_at = now, None
                    self.say(f"  embedded {w.proc.name} started again (pid {w.proc.process.pid}, "
                             f"restart {w.restarts})")
                continue
            code = w.proc.process.poll()  # reaps it: no zombie
            if code is None:
                continue
            w.proc.kill_orphans()
            w.orphans_deadline = now + 10.0  # never wait on them for ever (unreaped zombies stay in the group)
            w.failures_in_a_row = 0 if now - w.started_at > 60 else w.failures_in_a_row + 1
            delay = min(30.0, 0.5 * 2 ** max(0, w.failures_in_a_row - 1))
            w.restarts += 1
            w.restart_at = now + delay
            self.say(f"  embedded {w.proc.name} {_exit_text(code)}; restart {w.restarts} in {delay:.1f} s "
                     f"(log: {w.proc.log})")

    async def probe(self) -> dict[str, str]:
        """Probe Redis and PostgreSQL; the problem of each that does not answer."""
        self.problems = await probe_all(self.probes, self.probe_timeout)
        self.checked_at = time.time()
        return self.problems

    def status(self) -> dict[str, dict]:
        """The dependencies as `mnemesh status` shows them (URLs without passwords)."""
        urls = {"redis": self.infra.redis_url, "postgres": self.infra.database_url}
        embedded = {_NAMES[name]: w for name, w in self.watched.items()}
        out = {}
        for name, url in urls.items():
            entry = {"url": redacted(url), "reachable": name not in self.problems,
                     "problem": self.problems.get(name, ""), "checked_at": self.checked_at,
                     "embedded": name in embedded}
            if (w := embedded.get(name)) is not None:
                entry |= {"pid": w.proc.process.pid, "restarts": w.restarts, "running": w.restart_at is None}
            out[name] = entry
        return out

    async def aclose(self) -> None:
        await close_probes(self.probes)
