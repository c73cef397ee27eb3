"""Engagement: rises by one with each access, halves every half-life without one (no I/O)."""

from __future__ import annotations

from datetime import datetime, timedelta

__all__ = ["decayed", "engaged"]


def decayed(engagement: float, since: datetime | None, now: datetime, half_life: timedelta) -> float:
    """`engagement` as it stands at `now`, having decayed since `since` (None: no decay yet)."""
    if since is None or now <= since:
        return engagement
    return engagement * 0.5 ** ((now - since) / half_life)


def engaged(engagement: float, since: datetime | None, now: datetime, half_life: timedelta,
            accesses: int = 1) -> float:
    """The engagement after `accesses` accesses at `now`."""
    return decayed(engagement, since, now, half_life) + accesses
