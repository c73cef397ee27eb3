"""A consumer in a process of its own, so a test can kill it mid-handler.

    python consumer_process.py REDIS_URL DATABASE_URL SCHEMA STREAM GROUP CONSUMER

It prints "handling <event_id>" when a handler starts, then hangs inside the
handler's transaction (never acking, never committing) until it is killed.
"""

from __future__ import annotations

import asyncio
import sys

from libs.db import Database
from libs.events.bus import EventBus
from libs.idempotency import idempotent


async def main(redis_url: str, database_url: str, schema: str, stream: str, group: str, consumer: str) -> None:
    db = Database(database_url, schema)
    await db.open()
    bus = EventBus(redis_url, consumer_name=consumer, min_idle_ms=60_000)

    async def hang(envelope, conn) -> None:
        await conn.execute("INSERT INTO effects (event_id, handled_by) VALUES ($1, $2)", envelope.event_id, consumer)
        print(f"handling {envelope.event_id}", flush=True)
        await asyncio.Event().wait()

    bus.subscribe(stream, group, idempotent(db, group, hang))
    await bus.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
