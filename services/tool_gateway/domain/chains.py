"""Tool chains: the steps a caller's chain id has done, and what they allow. No I/O here.

A chain is the calls a caller makes under one chain id (gRPC `chain_id`, MCP `_meta`
`mnemesh/chain_id`). Its state (kept in Redis per chain id, with a TTL, by any replica) is one step
per (tool, arguments hash): the call id, how it ended, and where its result is kept. Two rules
come from it:

- `requires`: a tool runs only after each tool it requires has a successful step in the chain;
- resume: a step the chain already did successfully with the same arguments answers its kept
  result instead of calling the backend again, so a chain whose later step failed is resumed by
  calling its steps again in order, and only the failed step runs anew;
- one at a time: while a step (tool and arguments) of a chain runs, the same step of that chain is
  refused (StepRunning), so a caller retrying too early does not run it twice; it is called again
  once the first has ended, and then replays its result.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from libs.errors import DomainError
from services.tool_gateway.domain.registry import ToolSpec

__all__ = ["DONE_OUTCOMES", "FRESH_OUTCOMES", "Chain", "ChainFull", "ChainStep", "RequiresUnmet", "StepRunning",
           "check_requires", "check_room", "chain_full", "kept_step", "step_hold_seconds", "step_key", "step_running"]

DONE_OUTCOMES = frozenset({"ok", "fallback", "replayed"})  # a step that answered a result
FRESH_OUTCOMES = frozenset({"ok", "fallback"})  # a step whose backend answered anew (a new result)


class RequiresUnmet(DomainError):
    error_type = "requires_unmet"
    retryable = False


class ChainFull(DomainError):
    error_type = "chain_full"
    retryable = False


def chain_full(chain_id: str, max_steps: int) -> ChainFull:
    return ChainFull(f"chain {chain_id!r} holds its {max_steps} steps already: no new step is kept", field="chain_id",
                     hint="start a new chain id for further steps (or repeat a step it holds); a chain expires a "
                          "while after its last step")


class StepRunning(DomainError):
    error_type = "step_running"
    retryable = True


def step_running(chain_id: str, tool: str) -> StepRunning:
    return StepRunning(f"the same step of chain {chain_id!r} ({tool} with these arguments) is running now",
                       field="chain_id", hint="wait for it to end (GetCall with the chain id), then call again: "
                                              "a step that succeeded answers its kept result")


def step_hold_seconds(spec: ToolSpec, deadline_seconds: float) -> float:
    """How long a running step holds its chain's step: the call's deadline, else every attempt's timeout, plus a
    margin. Past it (a gateway replica lost mid-call) the step may run again."""
    return (deadline_seconds if deadline_seconds > 0 else spec.timeout_seconds * (spec.retries + 1)) + 30.0


@dataclass(frozen=True)
class ChainStep:
    tool: str
    args_sha256: str
    call_id: str
    outcome: str  # as in the audit row: "ok", "fallback", "error", "timeout", "cancelled"
    result_key: str = ""  # the call id whose whole result the result store keeps ("" when none)
    at: float = 0.0  # seconds since the epoch

    @property
    def done(self) -> bool:
        return self.outcome in DONE_OUTCOMES

    @property
    def fresh(self) -> bool:
        """Ran anew and answered: the only step that replaces a done one (a replayed one only renews the chain)."""
        return self.outcome in FRESH_OUTCOMES

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> ChainStep:
        return cls(**json.loads(text))


def step_key(tool: str, args_sha256: str) -> str:
    return f"{tool}\x1f{args_sha256}"


@dataclass(frozen=True)
class Chain:
    chain_id: str
    steps: tuple[ChainStep, ...] = ()

    def done_tools(self) -> frozenset[str]:
        return frozenset(s.tool for s in self.steps if s.done)


def check_requires(spec: ToolSpec, chain_id: str, chain: Chain | None) -> None:
    """Refuse a call of `spec` before every tool it requires has a successful step in the chain."""
    if not spec.requires:
        return
    done = chain.done_tools() if chain is not None else frozenset()
    missing = [name for name in spec.requires if name not in done]
    if not missing:
        return
    first = missing[0]
    if not chain_id:
        raise RequiresUnmet(f"{spec.name} runs only within a chain, after {', '.join(spec.requires)}",
                            field="chain_id",
                            hint=f"call {first} first, passing a chain id (gRPC chain_id, MCP _meta "
                                 f"mnemesh/chain_id), then {spec.name} with the same chain id")
    raise RequiresUnmet(f"{spec.name} requires {', '.join(missing)} done successfully in chain {chain_id!r} first"
                        + ("" if chain is not None else " (no step of this chain is known: new, or expired)"),
                        field="chain_id", hint=f"call {first} first with this chain id")


def check_room(chain: Chain | None, chain_id: str, tool: str, args_sha256: str, max_steps: int) -> None:
    """Refuse a new step (a tool and arguments the chain does not hold) of a chain that holds `max_steps`."""
    if chain is None or len(chain.steps) < max_steps:
        return
    if any(s.tool == tool and s.args_sha256 == args_sha256 for s in chain.steps):
        return
    raise chain_full(chain_id, max_steps)


def kept_step(chain: Chain | None, tool: str, args_sha256: str) -> ChainStep | None:
    """The chain's successful step of `tool` with these arguments whose result is kept, if any."""
    if chain is None:
        return None
    for step in chain.steps:
        if step.tool == tool and step.args_sha256 == args_sha256 and step.done and step.result_key:
            return step
    return None
