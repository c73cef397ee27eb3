"""Failures of what the code depends on (PostgreSQL, Redis, the network), as opposed to bugs or bad input.

They are retried, waited out, or answered as UNAVAILABLE; they never dead-letter an
event, since the event itself is fine.
"""

from __future__ import annotations

import psycopg
import psycopg_pool
import redis.exceptions

__all__ = ["TRANSIENT_ERRORS"]

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg_pool.PoolTimeout,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    ConnectionError,
    TimeoutError,
)
