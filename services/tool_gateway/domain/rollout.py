"""Versions and canaries: which version a caller gets, and when a canary is rolled back. No I/O.

A tool without a rollout serves its highest version. A rollout pins `stable` (new versions wait
until they are canaried or promoted) and may run a `canary`: the callers it names, and a share
`percent` of the others chosen by a hash of (tenant, caller, tool) so each caller sticks to one
arm. Each arm's calls and backend errors are counted; past `min_calls` canary calls, a canary
whose error rate exceeds stable's by more than `max_error_rate_delta` is rolled back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from libs.errors import Conflict, ValidationFailed

__all__ = ["ArmCounts", "Rollout", "arm_for", "promote", "roll_back", "rollback_reason", "start_canary"]


@dataclass(frozen=True)
class Rollout:
    name: str
    stable: str = ""  # empty: the highest version
    canary: str = ""  # empty: no canary
    percent: float = 0.0
    callers: tuple[str, ...] = ()
    max_error_rate_delta: float = 0.2
    min_calls: int = 20
    state: str = "stable"  # "stable", "canary", "rolled_back", "promoted"
    reason: str = ""
    epoch: str = ""  # changes with each canary: its counters start from zero


@dataclass(frozen=True)
class ArmCounts:
    stable_calls: int = 0
    stable_errors: int = 0
    canary_calls: int = 0
    canary_errors: int = 0


def _share(tenant_id: str, caller: str, tool: str) -> float:
    digest = hashlib.sha256(f"{tenant_id}\0{caller}\0{tool}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64 * 100


def arm_for(rollout: Rollout, tenant_id: str, caller: str) -> str:
    """"canary" or "stable" for this caller, the same on every call and every replica."""
    if not rollout.canary:
        return "stable"
    if caller in rollout.callers or _share(tenant_id, caller, rollout.name) < rollout.percent:
        return "canary"
    return "stable"


def start_canary(current: Rollout | None, name: str, version: str, *, stable: str, percent: float,
                 callers: tuple[str, ...] = (), max_error_rate_delta: float = 0.0, min_calls: int = 0,
                 epoch: str) -> Rollout:
    """`stable`: the version serving now (the pin, or the highest other than the canary)."""
    if not 0 <= percent <= 100:
        raise ValidationFailed("must be between 0 and 100", field="percent")
    if not percent and not callers:
        raise ValidationFailed("a canary needs a percentage or callers", field="percent",
                               hint="give --percent 5, or name callers that should get it")
    if not 0 <= max_error_rate_delta <= 1 or min_calls < 0:
        raise ValidationFailed("must be between 0 and 1 (min_calls at least 0)", field="max_error_rate_delta")
    if version == stable:
        raise Conflict(f"{name} {version} is already the stable version", field="version", retryable=False,
                       hint="register a new version and canary that one")
    return Rollout(name=name, stable=stable, canary=version, percent=percent, callers=tuple(callers),
                   max_error_rate_delta=max_error_rate_delta or 0.2, min_calls=min_calls or 20, state="canary",
                   epoch=epoch)


def promote(rollout: Rollout | None, name: str) -> Rollout:
    if rollout is None or not rollout.canary:
        raise Conflict(f"{name} has no canary to promote", field="name", retryable=False,
                       hint="start one with SetCanary (mnemesh tools canary)")
    return replace(rollout, stable=rollout.canary, canary="", percent=0.0, callers=(), state="promoted",
                   reason=f"{rollout.canary} promoted")


def roll_back(rollout: Rollout | None, name: str, *, version: str = "", reason: str = "rolled back") -> Rollout:
    """Stop the canary (everyone on stable); with no canary, pin stable to `version`."""
    if rollout is not None and rollout.canary:
        return replace(rollout, canary="", percent=0.0, callers=(), state="rolled_back",
                       reason=f"{rollout.canary}: {reason}")
    if not version:
        raise Conflict(f"{name} has no canary to roll back", field="version", retryable=False,
                       hint="name the version to go back to")
    base = rollout or Rollout(name=name)
    return replace(base, stable=version, state="rolled_back", reason=f"pinned to {version}: {reason}")


def rollback_reason(rollout: Rollout, counts: ArmCounts) -> str:
    """Why the canary must be rolled back now, or "" while it holds."""
    if not rollout.canary or counts.canary_calls < rollout.min_calls:
        return ""
    canary_rate = counts.canary_errors / counts.canary_calls
    stable_rate = counts.stable_errors / counts.stable_calls if counts.stable_calls else 0.0
    if canary_rate - stable_rate > rollout.max_error_rate_delta:
        return (f"error rate {canary_rate:.0%} over {counts.canary_calls} calls against stable's "
                f"{stable_rate:.0%} (allowed: +{rollout.max_error_rate_delta:.0%})")
    return ""
