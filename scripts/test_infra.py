"""Run a command with REDIS_URL and DATABASE_URL pointing at real servers.

    python scripts/test_infra.py -- <command...>

Uses REDIS_URL / DATABASE_URL when they are set (configured servers); otherwise
starts embedded ones (the same as `mnemesh run`) under .mnemesh/test and stops
them afterwards. MNEMESH_TEST_INFRA=local first tries the servers of this machine
on their default ports (127.0.0.1:6379, and 127.0.0.1:5432 as `postgres`, where
it creates the database mnemesh_test); CI sets it. The command's exit code is
returned; SIGTERM and Ctrl-C are passed on to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import asyncpg
import redis

from libs.config import load_settings, redacted
from mnemesh.infra import InfrastructureError, free_port, start_infrastructure
from mnemesh.processes import DataFolderBusy, data_folder_lock

LOCAL_REDIS = "redis://127.0.0.1:6379/0"
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
TEST_DATABASE = "mnemesh_test"


def _redis_answers(url: str) -> bool:
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except (redis.RedisError, OSError):
        return False


async def _postgres_test_db(admin_url: str) -> str | None:
    """Create the test database on a local server if needed; its URL, or None when no server answers."""
    try:
        conn = await asyncpg.connect(admin_url, timeout=2)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return None
    try:
        if not await conn.fetchval("SELECT true FROM pg_database WHERE datname = $1", TEST_DATABASE):
            await conn.execute(f'CREATE DATABASE "{TEST_DATABASE}"')
    finally:
        await conn.close()
    return admin_url.rsplit("/", 1)[0] + f"/{TEST_DATABASE}"


async def main(command: list[str]) -> int:
    env = dict(os.environ)
    if env.get("MNEMESH_TEST_INFRA") == "local":
        if not env.get("REDIS_URL") and _redis_answers(LOCAL_REDIS):
            env["REDIS_URL"] = LOCAL_REDIS
        if not env.get("DATABASE_URL") and (local := await _postgres_test_db(LOCAL_POSTGRES)):
            env["DATABASE_URL"] = local
    with contextlib.ExitStack() as stack:
        return await _run(command, env, stack)


async def _run(command: list[str], env: dict[str, str], stack: contextlib.ExitStack) -> int:
    infra = None
    if not env.get("REDIS_URL") or not env.get("DATABASE_URL"):
        print("test infrastructure: starting embedded servers for what is not configured", flush=True)
        settings = load_settings(redis_url=env.get("REDIS_URL"), database_url=env.get("DATABASE_URL"),
                                 data_dir=Path(".mnemesh/test"), embedded_redis_port=free_port(),
                                 embedded_postgres_port=free_port())
        try:
            stack.enter_context(data_folder_lock(settings.data_dir, holder="make test"))
            infra = await start_infrastructure(settings)
        except (InfrastructureError, DataFolderBusy) as exc:
            print(f"test infrastructure: {exc}", file=sys.stderr)
            return 2
        env.update(infra.env())
    print(f"test infrastructure: Redis {redacted(env['REDIS_URL'])}, PostgreSQL {redacted(env['DATABASE_URL'])}",
          flush=True)
    try:
        proc = await asyncio.create_subprocess_exec(*command, env=env)
        loop = asyncio.get_running_loop()
        # SIGTERM is passed on; a Ctrl-C already reaches the command through the terminal, so it is
        # only kept from stopping us before the command has finished.
        loop.add_signal_handler(signal.SIGTERM, proc.send_signal, signal.SIGTERM)
        loop.add_signal_handler(signal.SIGINT, lambda: None)
        return await proc.wait()
    finally:
        if infra:
            infra.stop()


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.exit(__doc__)
    sys.exit(asyncio.run(main(args)))
