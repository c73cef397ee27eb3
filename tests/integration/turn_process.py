"""An orchestrator in a process of its own, so a test can kill it mid-turn.

    python turn_process.py DATABASE_URL SCHEMA SESSION_ID

Sends "where is my order A12345?" to the session with a tool that never answers, prints
"calling <action id>" once the call is in flight, then waits to be killed.
"""

from __future__ import annotations

import asyncio
import sys

from libs.db import Database
from libs.eventstore import EventStore
from libs.outbox import Outbox
from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.repository import EventSourcedSessions
from services.orchestrator.adapters.rules_file import RulesFile
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.handlers import SendMessage, send_message


async def main(database_url: str, schema: str, session_id: str) -> None:
    db = Database(database_url, schema, max_size=4)
    await db.open()
    sessions = EventSourcedSessions(db, EventStore(db), Outbox(db))
    tools, memory = LocalTools(), LocalMemory()

    async def hangs(args):
        print(f"calling {tools.calls[-1][2]}", flush=True)
        await asyncio.Event().wait()

    tools.handlers["orders.get_status"] = hangs
    agent = Agent(sessions, RulesFile(), memory, tools, memory, tool_deadline_seconds=300, lease_seconds=600)
    await send_message(SendMessage("acme", "u1", session_id, "phone", "where is my order A12345?"), sessions, agent)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
