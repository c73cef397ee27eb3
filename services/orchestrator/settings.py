"""The orchestrator's own settings (MNEMESH_ORCHESTRATOR_*), read once in bootstrap."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.orchestrator.adapters.rules_file import DEFAULT_RULES

__all__ = ["OrchestratorSettings"]


class OrchestratorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MNEMESH_ORCHESTRATOR_", extra="ignore")

    rules_file: Path = DEFAULT_RULES
    rules_check_seconds: float = Field(1.0, gt=0)
    tool_deadline_seconds: float = Field(10.0, gt=0, le=600)
    snapshot_every: int = Field(100, ge=1)
    # A busy turn that has not moved for this long lost its runner (a process that died mid-turn) and is
    # taken over by the next Send. Must exceed the tool deadline (and an LLM decision, when one is configured).
    turn_lease_seconds: float = Field(60.0, gt=0, le=3600)
    # A timed-out call the gateway still reports running is asked about again for this long (GetCall by its
    # chain id) before it counts as not done and may be retried.
    verify_seconds: float = Field(5.0, ge=0, le=600)
    # How long an agent delegated to (A2A) has to answer, card and message together; then the delegation counts
    # as unanswered and its compensation runs (a tool call, within the tool deadline).
    a2a_timeout_seconds: float = Field(30.0, gt=0, le=600)
    # Empty: the in-process fixture tools and memory (development); else host:port of the service.
    tool_gateway: str = ""
    retriever: str = ""
    memory_writer: str = ""
    # A2A: the agent card (/.well-known/agent-card.json) and JSON-RPC endpoint (/a2a); 0: not served
    # (`mnemesh run` serves it on 8055).
    http_port: int = Field(0, ge=0, le=65535)
    public_url: str = ""  # the A2A URL the card gives; empty: http://<MNEMESH_HOST>:<http_port>/a2a
    # An OpenAI-compatible endpoint; empty: the deterministic planner decides.
    llm_base_url: str = ""
    llm_model: str = ""
    llm_api_key: SecretStr = SecretStr("")

    @model_validator(mode="after")
    def _lease_outlasts_a_call(self) -> OrchestratorSettings:
        call = self.tool_deadline_seconds + self.verify_seconds
        delegation = self.a2a_timeout_seconds + self.tool_deadline_seconds  # the answer, then the compensation
        if self.turn_lease_seconds <= max(call, delegation) + 1:
            raise ValueError(f"MNEMESH_ORCHESTRATOR_TURN_LEASE_SECONDS ({self.turn_lease_seconds:g}) must exceed "
                             f"MNEMESH_ORCHESTRATOR_TOOL_DEADLINE_SECONDS ({self.tool_deadline_seconds:g}) + "
                             f"MNEMESH_ORCHESTRATOR_VERIFY_SECONDS ({self.verify_seconds:g}) + 1 and "
                             f"MNEMESH_ORCHESTRATOR_A2A_TIMEOUT_SECONDS ({self.a2a_timeout_seconds:g}) + the tool "
                             "deadline (the compensation's) + 1: a call or a delegation in flight would look like "
                             "a dead runner")
        return self
