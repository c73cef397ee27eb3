"""The event loop a service runs on: uvloop (libuv, in C) unless MNEMESH_EVENT_LOOP=asyncio.

`run` replaces asyncio.run where a service's loop is created (`mnemesh serve`, `mnemesh tools
serve-stdio`). When uvloop cannot be imported the service runs on asyncio's own loop, and
`note_event_loop` (called once logging is configured) says so in the service's log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from libs.logs import get_logger

__all__ = ["loop_factory", "note_event_loop", "run"]

T = TypeVar("T")
log = get_logger(__name__)


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor for choice "uvloop" when uvloop is installed; None: asyncio's default."""
    if choice != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """asyncio.run(main) on the loop `choice` names ("uvloop" or "asyncio")."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)


def note_event_loop(choice: str) -> None:
    """Log the running loop; a warning when uvloop was asked for but cannot be imported."""
    loop = asyncio.get_running_loop()
    running = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
    if running != "uvloop" and loop_factory(choice) is None and choice == "uvloop":
        log.warning("uvloop cannot be imported: running on asyncio's event loop; install uvloop, "
                    "or set MNEMESH_EVENT_LOOP=asyncio to silence this")
    else:
        log.info("event loop", loop=running)
