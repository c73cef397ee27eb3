"""An outbox relay in a process of its own that dies right after its first publish.

    python relay_process.py REDIS_URL DATABASE_URL SCHEMA

The stream has the entry; the outbox row is never marked published.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta

from libs.db import Database
from libs.events import Envelope
from libs.events.bus import EventBus
from libs.outbox import Outbox, OutboxRelay


class DieAfterPublish(EventBus):
    async def publish(self, envelope: Envelope, stream: str | None = None) -> str:
        entry_id = await super().publish(envelope, stream)
        print(f"published {envelope.event_id}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        return entry_id


async def main(redis_url: str, database_url: str, schema: str) -> None:
    db = Database(database_url, schema)
    await db.open()
    relay = OutboxRelay(Outbox(db), DieAfterPublish(redis_url, consumer_name="doomed"), lease=timedelta(seconds=1))
    await relay.publish_pending()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
