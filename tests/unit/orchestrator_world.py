"""The world the agent-loop tests run in: the agent over fakes with the default rules, and its last reply."""

from __future__ import annotations

import pytest
from fakes import FakeSessionRepository

from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.rules_file import DEFAULT_RULES
from services.orchestrator.domain import MessageAppended, Session, StateChanged
from services.orchestrator.domain.rulebook import parse_rulebook
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.handlers import SendMessage, send_message

__all__ = ["World", "last_reply", "world_fixture"]

BOOK = parse_rulebook(DEFAULT_RULES.read_text(encoding="utf-8"))


class World:
    def __init__(self, llm=None) -> None:
        self.sessions, self.memory, self.tools = FakeSessionRepository(), LocalMemory(), LocalTools()
        self.agent = Agent(self.sessions, lambda: BOOK, self.memory, self.tools, self.memory, llm,
                           tool_deadline_seconds=5.0)

    async def say(self, text: str, device: str = "web") -> Session:
        return await send_message(SendMessage("acme", "u1", "s1", device, text), self.sessions, self.agent)

    async def transitions(self) -> list[tuple[str, str]]:
        return [(e.event.from_state, e.event.to_state) for e in await self.sessions.history("acme", "s1")
                if isinstance(e.event, StateChanged)]

    async def events(self, kind: type) -> list:
        return [e.event for e in await self.sessions.history("acme", "s1") if isinstance(e.event, kind)]


@pytest.fixture(name="world")
def world_fixture() -> World:
    return World()


def last_reply(session: Session) -> MessageAppended:
    return next(m for m in reversed(session.messages) if m.role == "assistant")
