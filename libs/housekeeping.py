"""Periodic upkeep of one service: trim its streams safely, purge what has served its time."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import redis.exceptions

from libs.db import Database, rowcount
from libs.events.bus import EventBus
from libs.logs import get_logger
from libs.outbox import OutboxRelay
from libs.transient import is_transient

__all__ = ["housekeeping", "tidy"]

log = get_logger(__name__)


async def tidy(bus: EventBus, relay: OutboxRelay, db: Database, *, processed_retention: timedelta) -> None:
    """One round: trim streams, drop published outbox rows, forget old processed-event ids.

    Processed ids older than the retention only matter for redeliveries older than
    that, which stream trimming and reclaim timing rule out.
    """
    trimmed = await bus.trim()
    pruned = await bus.prune_consumers()
    purged = await relay.purge_published()
    async with db.system_transaction() as conn:
        processed = rowcount(await conn.execute(
            "DELETE FROM processed_events WHERE processed_at < now() - $1::interval", processed_retention))
    log.info("housekeeping", trimmed=trimmed, consumers_pruned=pruned, outbox_purged=purged,
             processed_purged=processed)


async def housekeeping(bus: EventBus, relay: OutboxRelay, db: Database, *, every_seconds: float,
                       processed_retention: timedelta) -> None:
    while True:
        await asyncio.sleep(every_seconds)
        try:
            await tidy(bus, relay, db, processed_retention=processed_retention)
        except (OSError, redis.exceptions.RedisError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if not is_transient(exc):
                raise
            log.warning("housekeeping failed; will try again", error=str(exc))
