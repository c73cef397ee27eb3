"""The agent's slot steps: values from the user's answers, from memory (an L1 memory used as it is, an L2 one
offered for a yes or no first), and the question asked when a slot is still missing.

A part of `Agent` (service_layer/agent.py), which provides `rules`, `retriever`, `memory`, `_commit` and `_ask`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from libs.logs import get_logger
from services.orchestrator.domain import Session, SessionEvent, SlotDeclined, SlotFilled, SlotOffered, State
from services.orchestrator.domain.interrupts import Interrupt, Kind
from services.orchestrator.domain.rulebook import RuleBook
from services.orchestrator.service_layer.ports import MemoryHit
from services.orchestrator.service_layer.templating import fill

if TYPE_CHECKING:
    from collections.abc import Callable

    from services.orchestrator.service_layer.ports import MemoryWriter, Retriever

__all__ = ["CONFIRMED", "SlotConfirmation"]

log = get_logger(__name__)
CONFIRMED = "memory:L2-confirmed:"  # the source of a slot filled from an L2 memory the user confirmed


class SlotConfirmation:
    rules: Callable[[], RuleBook]
    retriever: Retriever
    memory: MemoryWriter

    def unless_answering(self, session: Session, text: str, interrupt: Interrupt | None) -> Interrupt | None:
        """The interrupt, unless the message answers the offer of a remembered value: "no, not that one" and
        "no, it is B54321" open like a redirect ("no, ...") but answer the question ("shall I use A12345?").
        A redirect whose rest is a request a rule recognises ("不对，先查发票 B54321") stays a redirect."""
        task = session.task
        if interrupt is None or interrupt.kind != Kind.REDIRECT or task is None or not task.offers \
                or session.state != State.IDLE or task.decision is None:
            return interrupt
        book = self.rules()
        intent = book.intents.get(task.decision.intent)
        validators = [s.validator for s in intent.slots if s.name in task.offers] if intent else []
        if book.confirm.classify(text) is not None and (
                book.confirm.classify(interrupt.rest) is not None  # "no, not that one"
                or (any(v.extract(interrupt.rest)[0] is not None for v in validators)  # "no, it is B54321"
                    and book.match(interrupt.rest) is None)):  # ...and not "no, check the invoice of B54321"
            return None
        return interrupt

    def _answer_slots(self, session: Session, book: RuleBook) -> list[SessionEvent]:
        task = session.task
        intent = book.intents.get(task.decision.intent)
        events = []
        for slot in intent.slots if intent else ():
            if slot.name in task.slots:
                continue
            value = next((v for v in (slot.validator.extract(a)[0] for a in task.answers) if v is not None), None)
            offer = task.offers.get(slot.name)
            if offer is not None:  # an L2 memory's value awaits the user's yes or no
                offered, memory_id = offer
                said = book.confirm.classify(task.answers[-1]) if task.answers else None
                if value is not None and value != offered:
                    events.append(SlotDeclined(task.task_id, slot.name, memory_id, "the user gave another value"))
                elif value is not None or said == "yes":
                    events.append(SlotFilled(task.task_id, slot.name, offered, f"{CONFIRMED}{memory_id}"))
                    continue
                elif said == "no":
                    events.append(SlotDeclined(task.task_id, slot.name, memory_id,
                                               f"the user said no: {task.answers[-1][:200]!r}"))
                    continue
                else:
                    continue  # neither yes nor no: the question is asked again
            if value is not None:
                events.append(SlotFilled(task.task_id, slot.name, value, "answer"))
        return events

    async def _confirm_memory(self, session: Session, user_id: str, memory_id: str, slot: str) -> None:
        """The user confirmed an L2 memory: it becomes L1, used without asking from then on (advisory)."""
        try:
            await self.memory.confirm(session.tenant_id, user_id, memory_id,
                                      f"confirmed by the user as {slot} in session {session.session_id}")
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("the confirmed memory was not promoted", memory_id=memory_id, error=str(exc))

    async def _missing_slot(self, session: Session, intent, user_id: str) -> Session | None:
        task = session.task
        book = self.rules()
        for slot in intent.slots:
            if slot.name in task.slots:
                continue
            label = slot.name.replace("_", " ")
            if slot.name in task.offers:  # offered, and the answer was neither yes nor no
                value, memory_id = task.offers[slot.name]
                return await self._ask(session, fill(book.template("confirm_again"), {"value": value, "slot": label}),
                                       f"slot {slot.name}: the offered memory awaits yes or no", (memory_id,))
            if slot.memory_key:  # a memory under the key, found by what the user asked and the key's words
                found = await self._from_memory(session, slot, user_id)
                if found is not None and found[0].strong:  # L1: used without asking
                    return await self._commit(session, [SlotFilled(task.task_id, slot.name, found[1],
                                                                   f"memory:L1:{found[0].memory_id}")])
                if found is not None:  # L2: confirm before use
                    hit, value = found
                    return await self._ask(
                        session, fill(book.template("confirm_slot"), {"value": value, "slot": label}),
                        f"slot {slot.name} offered from L2 memory {hit.memory_id}: confirm before use",
                        (hit.memory_id,), SlotOffered(task.task_id, slot.name, value, hit.memory_id))
            _, refused = slot.validator.extract(" ".join([task.text, *task.answers]))
            question = f"{refused[0].upper()}{refused[1:]}. {slot.question}" if refused else slot.question
            return await self._ask(session, question, f"slot {slot.name} missing")
        return None

    async def _from_memory(self, session: Session, slot, user_id: str) -> tuple[MemoryHit, str] | None:
        """The best memory under the slot's key holding a valid value: an L1 one first, else an L2 one ("confirm
        before use") the user has not declined in this task; L3 memories are advisory and never fill a slot."""
        task = session.task
        query = f"{task.text} {slot.memory_key.replace('_', ' ')}"
        hits = await self.retriever.search(session.tenant_id, user_id, session.session_id, query, 10)
        usable = []
        for hit in hits:
            if hit.key != slot.memory_key or hit.memory_id in task.declined or not (hit.strong or hit.must_confirm):
                continue
            value = slot.validator.extract(hit.content)[0]
            if value is not None:
                usable.append((hit, value))
        return next((u for u in usable if u[0].strong), usable[0] if usable else None)
