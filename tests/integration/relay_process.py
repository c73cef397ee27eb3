"""An outbox relay in a process of its own, so a test can kill it.

    python relay_process.py REDIS_URL DATABASE_URL SCHEMA doomed   # dies right after its first publish
    python relay_process.py REDIS_URL DATABASE_URL SCHEMA steady   # runs until killed, publishing slowly

"doomed": the stream has the entry; the outbox row is never marked published.
"steady": prints "leading" when it becomes the leader, and "published <event id>" after each publish.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from libs.db import Database
from libs.events import Envelope
from libs.events.bus import EventBus
from libs.outbox import Outbox, OutboxRelay


class DieAfterPublish(EventBus):
    async def publish_fenced_batch(self, items: list[tuple[Envelope, str]], fence) -> int:
        await super().publish_fenced_batch(items[:1], fence)
        print(f"published {items[0][0].event_id}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        return 1


class SlowPublisher(EventBus):
    async def publish_fenced_batch(self, items: list[tuple[Envelope, str]], fence) -> int:
        sent = 0
        for item in items:  # one at a time, slowly: a test can kill the leader part-way through a batch
            await asyncio.sleep(0.01)
            if not await super().publish_fenced_batch([item], fence):
                break
            sent += 1
            print(f"published {item[0].event_id}", flush=True)
        return sent


async def main(redis_url: str, database_url: str, schema: str, mode: str) -> None:
    db = Database(database_url, schema)
    await db.open()
    if mode == "doomed":
        relay = OutboxRelay(Outbox(db), DieAfterPublish(redis_url, consumer_name="doomed"))
        await relay.publish_pending()
        return
    relay = OutboxRelay(Outbox(db), SlowPublisher(redis_url, consumer_name=f"relay-{os.getpid()}"),
                        poll_seconds=0.1, batch=10)

    async def announce() -> None:
        await relay.leading.wait()
        print("leading", flush=True)

    print("ready", flush=True)
    await asyncio.gather(relay.run(), announce())


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
