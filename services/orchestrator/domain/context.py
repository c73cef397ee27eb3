"""The context a model decides from, built to a token budget per part.

Parts: system, tools, memory (tool results of this task, then recalled memories), history (the
session's earlier turns, newest kept first), task (the user's request and answers), and the
generation reserve (what is left of the window, never less than its minimum). Every memory and tool
result is injected under a labelled anchor tied to its id (`[memory:<id>]`, `[step:<action id>]`),
so a decision or reply can cite it and a grounding check can trace it back.

When the history does not fit its part, the oldest turns are left out and the context says the
history should be compressed (the memory-writer's CompressSession), so the next turns find a summary
among their memories instead of losing those turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Budget", "Context", "ContextInput", "TokenCounter", "build_context"]

_MIN_PIECE = 16  # a piece cut to fewer tokens than this says too little to keep
_ANCHORED = "Memories and tool results; cite them by their anchor:"
_EARLIER = "Earlier in this conversation:"
_SUMMARISED = "Earlier in this conversation (older turns are summarised in memory):"


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...

    def truncate(self, text: str, tokens: int) -> str: ...


@dataclass(frozen=True)
class Budget:
    """Tokens per part; the generation reserve is the rest of the window."""

    window: int = 4096
    system: int = 512
    tools: int = 768
    memory: int = 1024
    history: int = 640
    task: int = 512
    min_reserve: int = 512

    def __post_init__(self) -> None:
        if min(self.system, self.tools, self.memory, self.history, self.task) < 0:
            raise ValueError("a part's budget cannot be negative")
        if self.reserve < self.min_reserve:
            raise ValueError(f"the parts take {self.window - self.reserve} of {self.window} tokens, leaving "
                             f"{self.reserve} for the answer, less than min_reserve {self.min_reserve}: "
                             "shrink a part or grow the window")

    @property
    def reserve(self) -> int:
        return self.window - (self.system + self.tools + self.memory + self.history + self.task)


@dataclass(frozen=True)
class ContextInput:
    system: str
    task: str
    tools: list[tuple[str, str]] = field(default_factory=list)          # (name, description), best first
    steps: list[tuple[str, str, str]] = field(default_factory=list)     # (action id, tool, result JSON)
    memories: list[tuple[str, str]] = field(default_factory=list)       # (memory id, content), best first
    history: list[tuple[str, str]] = field(default_factory=list)        # (role, text), oldest first


@dataclass(frozen=True)
class Context:
    messages: list[dict[str, str]]
    tools: tuple[str, ...]             # the tools offered (those that fit)
    used: dict[str, int]               # tokens per part, and the reserve left for the answer
    anchors: tuple[str, ...]           # memory:<id> and step:<id> in the context, in order
    dropped: tuple[str, ...]           # anchors and tools left out for lack of room
    compress_history: bool = False     # earlier turns did not fit: ask the memory-writer to compress them


class _Part:
    def __init__(self, counter: TokenCounter, budget: int) -> None:
        self.counter, self.left, self.used, self.lines = counter, budget, 0, []

    def add(self, text: str, *, cut: bool = True) -> bool:
        """Add `text` (a line); when it does not fit, a cut of it if allowed and worth it; else refuse."""
        tokens = self.counter.count(text) + 1  # the line break
        if tokens > self.left:
            if not cut or self.left - 1 < _MIN_PIECE:
                return False
            text = self.counter.truncate(text, self.left - 2) + "…"
            tokens = self.counter.count(text) + 1
        self.lines.append(text)
        self.left -= tokens
        self.used += tokens
        return True


def build_context(data: ContextInput, counter: TokenCounter, budget: Budget) -> Context:
    anchors: list[str] = []
    dropped: list[str] = []

    system = _Part(counter, budget.system)
    if not system.add(data.system, cut=False):  # a cut instruction would change what is asked: refuse
        raise ValueError(f"the system prompt takes {counter.count(data.system)} tokens, more than its budget "
                         f"of {budget.system}: raise Budget.system")

    tools = _Part(counter, budget.tools)
    offered = []
    for name, description in data.tools:
        if tools.add(f"- {name}: {description}", cut=False):
            offered.append(name)
        else:
            dropped.append(f"tool:{name}")

    memory = _Part(counter, budget.memory)
    for anchor, text in [*((f"step:{a}", f"{tool} answered {result}") for a, tool, result in data.steps),
                         *((f"memory:{m}", content) for m, content in data.memories)]:
        (anchors if memory.add(f"[{anchor}] {text}") else dropped).append(anchor)

    task = _Part(counter, budget.task)
    task.add(data.task)

    history = _Part(counter, budget.history)
    kept = []
    for role, text in reversed(data.history):  # newest first: the turns nearest the task matter most
        line = f"{role}: {text}"
        if not history.add(line, cut=False):
            break
        kept.append(line)
    compress = len(kept) < len(data.history)

    headings = []
    messages = [{"role": "system", "content": "\n".join(system.lines)}]
    if memory.lines:
        headings.append(_ANCHORED)
        messages.append({"role": "system", "content": _ANCHORED + "\n" + "\n".join(memory.lines)})
    if kept:
        headings.append(_SUMMARISED if compress else _EARLIER)
        messages.append({"role": "system", "content": headings[-1] + "\n" + "\n".join(reversed(kept))})
    messages.append({"role": "user", "content": "\n".join(task.lines)})
    used = {"system": system.used, "tools": tools.used, "memory": memory.used, "history": history.used,
            "task": task.used}
    # What is left for the answer, the headings included (each part counts only its own lines).
    used["reserve"] = budget.window - sum(used.values()) - sum(counter.count(h) + 1 for h in headings)
    return Context(messages, tuple(offered), used, tuple(anchors), tuple(dropped), compress)
