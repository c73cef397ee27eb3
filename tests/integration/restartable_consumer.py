"""A consumer in a process of its own, so a test can kill it mid-handler and start it again.

    python restartable_consumer.py REDIS_URL STREAM GROUP CONSUMER MODE

It prints "ready" once subscribed, then "handling <event_id> <delivery>" when a handler starts.
MODE "hang" never finishes a handler (the test kills it); MODE "finish" prints
"handled <event_id>" and lets the bus acknowledge. Its claimer waits a minute before it takes
an entry from anybody, so only taking back its own entries at start can explain a quick retry.
"""

from __future__ import annotations

import asyncio
import sys

from libs.events.bus import EventBus


async def main(redis_url: str, stream: str, group: str, consumer: str, mode: str) -> None:
    bus = EventBus(redis_url, consumer_name=consumer, min_idle_ms=60_000)

    async def handle(envelope) -> None:
        print(f"handling {envelope.event_id}", flush=True)
        if mode == "hang":
            await asyncio.Event().wait()
        print(f"handled {envelope.event_id}", flush=True)

    bus.subscribe(stream, group, handle)
    await bus.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
