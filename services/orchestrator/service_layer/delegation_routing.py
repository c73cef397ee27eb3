"""The agent's delegation steps: ROUTING a task to another agent (its outcome checked, compensated on a
mismatch; handed to a person when that cannot be settled), and GENERATING the reply of a delegated task.

A part of `Agent` (service_layer/agent.py), which provides `rules`, `sessions`, `memory`, `gateway`, `agents`,
the deadlines, `_commit`, `_say`, `_cancelled` and `_record_turn`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from services.orchestrator.domain import Handling, Outcome, Session, State, StateChanged, TaskEnded
from services.orchestrator.domain.grounding import Source, check_reply
from services.orchestrator.service_layer.delegation import Compensation, Delegate, Expectation, delegate
from services.orchestrator.service_layer.templating import fill

if TYPE_CHECKING:
    from collections.abc import Callable

    from services.orchestrator.domain.rulebook import RuleBook
    from services.orchestrator.service_layer.delegation import AgentClient
    from services.orchestrator.service_layer.ports import MemoryWriter, SessionRepository, ToolGateway

__all__ = ["DelegationRouting"]


class DelegationRouting:
    rules: Callable[[], RuleBook]
    sessions: SessionRepository
    memory: MemoryWriter
    gateway: ToolGateway
    agents: AgentClient | None
    tool_deadline_seconds: float
    delegation_seconds: float

    async def _delegate(self, session: Session, user_id: str) -> Session:
        task, book = session.task, self.rules()
        asked = json.loads(task.decision.arguments_json)
        spec = book.agents.get(asked.get("agent", ""))
        if task.delegation is None:
            if spec is None or self.agents is None:
                why = "no agent client is configured" if spec is not None else \
                    f"agent {asked.get('agent')!r} is no longer declared in the rules"
                return await self._hand_over(session, book.template("human"), f"cannot delegate: {why}")
            done = await delegate(Delegate(session.tenant_id, user_id, session.session_id, spec.url, asked["text"],
                                    Expectation(spec.expect_state, spec.reply_contains),
                                    Compensation(spec.compensation_tool, spec.compensation_arguments)),
                           self.sessions, self.memory, self.agents, self.gateway, self.tool_deadline_seconds,
                           stopped=lambda: self._cancelled(session, task.task_id, ""),
                           answer_seconds=self.delegation_seconds)
            if done.taken_over:  # this runner lost its lease: the one that took over carries the task on
                return session
            session = await self.sessions.load(session.tenant_id, session.session_id)
            if not session.busy_with(task.task_id, State.ROUTING):
                return session  # interrupted meanwhile: the delegation's steps are recorded, the task is gone
        d = session.task.delegation
        name = spec.name if spec else asked.get("agent", "")
        if d is None or not d.settled():  # its runner stopped half-way: what the agent did cannot be known here
            return await self._hand_over(session, fill(book.template("delegation_unsettled"), {"agent": name}),
                                         f"the delegation to {name} was left unfinished")
        if d.matched:
            return await self._commit(session, [StateChanged(State.ROUTING, State.GENERATING,
                                                             f"the delegation to {name} delivered what was expected",
                                                             task_id=task.task_id)])
        if d.compensation == "ok":
            return await self._commit(session, [StateChanged(State.ROUTING, State.GENERATING,
                                                             f"the delegation to {name} mismatched ({d.reason}); "
                                                             "compensated", task_id=task.task_id)])
        return await self._hand_over(session, fill(book.template("delegation_unsettled"), {"agent": name}),
                                     f"the delegation to {name} mismatched ({d.reason}) and its compensation "
                                     f"ended {d.compensation}")

    async def _hand_over(self, session: Session, text: str, reason: str) -> Session:
        tid = session.task.task_id
        return await self._commit(session, [self._say(session, text, Handling.REPLY),
                                            TaskEnded(tid, Outcome.ESCALATED, reason),
                                            StateChanged(session.state, State.ESCALATE_TO_HUMAN, reason)])

    async def _generate_delegated(self, session: Session, user_id: str) -> Session:
        """The agent's own reply when it delivered what was expected; else what went wrong and what undid it."""
        task, book = session.task, self.rules()
        d = task.delegation
        agent = json.loads(task.decision.arguments_json).get("agent", "")
        if d.matched:
            reply, sources, outcome = d.reply, [Source(d.actual_memory_id or d.delegation_id, d.reply)], Outcome.DONE
            reason = f"replied with the answer of {agent}"
        else:
            tool = next((a.compensation_tool for a in book.agents.values() if a.name == agent), "") or "its compensation"
            reply = fill(book.template("delegation_failed"), {"agent": agent, "reason": d.reason, "tool": tool})
            sources, outcome = [Source(d.delegation_id, f"{agent} {d.reason} {tool}")], Outcome.COMPENSATED
            reason = f"the delegation to {agent} mismatched ({d.reason}); compensated"
        problems = check_reply(reply, sources, [], book.max_reply_chars)
        if problems:
            reply, reason = book.template("unknown"), f"reply replaced by a template: {'; '.join(problems)}"
        after = await self._commit(session, [self._say(session, reply, Handling.REPLY, tuple(s.ref for s in sources)),
                                              TaskEnded(task.task_id, outcome, reason),
                                              StateChanged(State.GENERATING, State.IDLE, reason)])
        if after.version > session.version:
            await self._record_turn(session, user_id, reply)
        return after
