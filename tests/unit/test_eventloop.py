"""The services' event loop: uvloop by default, asyncio's own on request or when uvloop is missing."""

from __future__ import annotations

import asyncio
import sys

import pytest

from libs import eventloop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_runs_the_coroutine_by_default_and_asyncio_on_request() -> None:
    assert eventloop.run(_loop_module(), "uvloop").startswith("uvloop")
    assert eventloop.run(_loop_module(), "asyncio").startswith("asyncio")


def test_without_uvloop_the_service_runs_on_asyncio_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    warnings: list[str] = []
    monkeypatch.setattr(eventloop.log, "warning", lambda event, **_: warnings.append(event))

    async def main() -> str:
        eventloop.note_event_loop("uvloop")
        return await _loop_module()

    assert eventloop.run(main(), "uvloop").startswith("asyncio")
    assert len(warnings) == 1 and "uvloop cannot be imported" in warnings[0]


def test_asyncio_on_request_is_not_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    warnings: list[str] = []
    monkeypatch.setattr(eventloop.log, "warning", lambda event, **_: warnings.append(event))

    async def main() -> None:
        eventloop.note_event_loop("asyncio")

    eventloop.run(main(), "asyncio")
    assert warnings == []
