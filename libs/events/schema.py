"""The one table of stream event types: stream, type string, version, payload message.

Producers, consumers and the AsyncAPI generator all read this table; the payload
messages themselves are defined once, in proto/mnemesh/v1/events.proto.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from libs.protogen.mnemesh.v1 import events_pb2, memory_pb2

__all__ = ["EVENT_TYPES", "STREAMS", "EventType", "Stream", "dead_letter_stream"]


@dataclass(frozen=True)
class Stream:
    name: str
    owner: str  # the one service that writes it
    description: str
    # Written from outside the mesh: each entry carries a producer JWT with the scope
    # `produce:<name>`, verified before any handler runs (libs/events/producers.py).
    # Internal streams are written only by the owning service's Redis user (infra/redis/users.acl).
    external: bool = False


@dataclass(frozen=True)
class EventType:
    name: str
    version: int
    stream: str
    message: type[Message]
    description: str


MEMORY_COMMANDS = "mnemesh.memory.commands"
MEMORY_EVENTS = "mnemesh.memory.events"
MEMORY_ACCESS = "mnemesh.memory.access"
TOOL_EVENTS = "mnemesh.tool.events"
SESSION_EVENTS = "mnemesh.session.events"

STREAMS: dict[str, Stream] = {
    s.name: s
    for s in [
        Stream(MEMORY_COMMANDS, "producers", "Write commands from event producers to the memory-writer.",
               external=True),
        Stream(MEMORY_EVENTS, "memory-writer", "Memories written, corrected, expired or forgotten."),
        Stream(MEMORY_ACCESS, "retriever", "Batched memory accesses that update engagement."),
        Stream(TOOL_EVENTS, "tool-gateway", "Tool registrations, removals and calls; feeds procedural memory."),
        Stream(SESSION_EVENTS, "orchestrator", "Session events, mirrored from the session event store."),
    ]
}

EVENT_TYPES: dict[str, EventType] = {
    t.name: t
    for t in [
        EventType("memory.write_requested", 1, MEMORY_COMMANDS, memory_pb2.WriteMemoryRequest,
                  "Ask the memory-writer to write one memory (same pipeline as gRPC Write)."),
        EventType("memory.written", 1, MEMORY_EVENTS, events_pb2.MemoryWritten,
                  "A memory was validated and persisted."),
        EventType("memory.corrected", 1, MEMORY_EVENTS, events_pb2.MemoryCorrected,
                  "A value of an entity key superseded the previous one (the chain is kept)."),
        EventType("memory.confirmed", 1, MEMORY_EVENTS, events_pb2.MemoryConfirmed,
                  "A memory was confirmed by the user and raised to L1."),
        EventType("memory.quarantined", 1, MEMORY_EVENTS, events_pb2.MemoryQuarantined,
                  "The poisoning guard held a write for review (no content)."),
        EventType("memory.released", 1, MEMORY_EVENTS, events_pb2.MemoryReleased,
                  "A quarantined memory was released; its memory.written follows."),
        EventType("memory.merged", 1, MEMORY_EVENTS, events_pb2.MemoryMerged,
                  "An identical write was merged into an existing memory (provenance, engagement)."),
        EventType("memory.expired", 1, MEMORY_EVENTS, events_pb2.MemoryExpired,
                  "The sweeper removed memories past their expiry."),
        EventType("memory.archived", 1, MEMORY_EVENTS, events_pb2.MemoryArchived,
                  "The sweeper archived memories idle past the archive period."),
        EventType("memory.session_compressed", 1, MEMORY_EVENTS, events_pb2.SessionCompressed,
                  "A session's turns were summarised into one memory (derived_from lists them)."),
        EventType("memory.forgotten", 1, MEMORY_EVENTS, events_pb2.MemoryForgotten,
                  "Memories were removed (forget, expiry or crypto-shredding)."),
        EventType("memory.accessed", 1, MEMORY_ACCESS, events_pb2.MemoryAccessed,
                  "Memories were returned by a search."),
        EventType("tool.registered", 1, TOOL_EVENTS, events_pb2.ToolRegistered,
                  "A tool (version) was added to the registry."),
        EventType("tool.removed", 1, TOOL_EVENTS, events_pb2.ToolRemoved,
                  "Versions of a tool (or every version: the tool) left the registry."),
        EventType("tool.called", 1, TOOL_EVENTS, events_pb2.ToolCalled,
                  "A tool call finished, with its outcome and latency."),
        EventType("session.message_appended", 1, SESSION_EVENTS, events_pb2.SessionMessageAppended,
                  "A user or assistant message was appended to a session."),
        EventType("session.state_changed", 1, SESSION_EVENTS, events_pb2.SessionStateChanged,
                  "A session's state machine moved."),
        EventType("session.task_started", 1, SESSION_EVENTS, events_pb2.SessionTaskStarted,
                  "A task (what a user message asked for) began."),
        EventType("session.task_ended", 1, SESSION_EVENTS, events_pb2.SessionTaskEnded,
                  "A task ended: done, cancelled, dropped, escalated or blocked."),
        EventType("session.slot_filled", 1, SESSION_EVENTS, events_pb2.SessionSlotFilled,
                  "A required slot of a task's intent got its value, with where it came from."),
        EventType("session.slot_offered", 1, SESSION_EVENTS, events_pb2.SessionSlotOffered,
                  "An L2 memory's value for a missing slot was offered to the user to confirm before use."),
        EventType("session.slot_declined", 1, SESSION_EVENTS, events_pb2.SessionSlotDeclined,
                  "The user did not confirm an offered memory value; the slot is asked for."),
        EventType("session.decision_made", 1, SESSION_EVENTS, events_pb2.SessionDecisionMade,
                  "A rule, the planner or the LLM decided what to do for a task."),
        EventType("session.action_started", 1, SESSION_EVENTS, events_pb2.SessionActionStarted,
                  "A tool call of a task began (its action id is the gateway call id and memory step id)."),
        EventType("session.action_finished", 1, SESSION_EVENTS, events_pb2.SessionActionFinished,
                  "A tool call of a task finished: ok, error, timeout or cancelled."),
        EventType("session.turn_recovered", 1, SESSION_EVENTS, events_pb2.SessionTurnRecovered,
                  "A turn left busy by a runner that stopped (its lease ran out) was taken over."),
        EventType("session.delegation_started", 1, SESSION_EVENTS, events_pb2.SessionDelegationStarted,
                  "A call to another agent began, its expected outcome recorded in memory first."),
        EventType("session.delegation_answered", 1, SESSION_EVENTS, events_pb2.SessionDelegationAnswered,
                  "The called agent answered, with the memory id of the actual outcome it recorded."),
        EventType("session.delegation_checked", 1, SESSION_EVENTS, events_pb2.SessionDelegationChecked,
                  "A delegation's actual outcome was compared with the expected one."),
        EventType("session.compensation_finished", 1, SESSION_EVENTS, events_pb2.SessionCompensationFinished,
                  "The declared compensation of a mismatched delegation ran."),
    ]
}



def dead_letter_stream(stream: str) -> str:
    return f"{stream}.dead"
