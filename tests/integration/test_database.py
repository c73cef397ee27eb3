"""The service's database pool on real PostgreSQL: shutdown never hangs on a connection someone kept."""

from __future__ import annotations

import time

import pytest

from libs.db import Database

pytestmark = pytest.mark.integration


async def test_closing_with_a_connection_still_held_finishes_within_its_timeout(database_url: str, schema: str) -> None:
    db = Database(database_url, schema)
    await db.open()
    await db.pool.acquire()  # a task that never gives it back
    started = time.monotonic()
    await db.close(timeout=0.5)
    assert time.monotonic() - started < 5
    assert db.pool is None
