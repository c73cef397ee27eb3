"""Decisions from any OpenAI-compatible chat endpoint with function calling.

The model is offered one function, `decide`, whose parameters are the decision's shape (and
the caller's tools are listed in the system prompt), and is required to call it; its arguments,
or failing that a JSON object in the message text, are the decision. Validation happens in the service layer.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from services.orchestrator.service_layer.planner import DECISION_PARAMETERS
from services.orchestrator.service_layer.ports import ToolInfo

__all__ = ["OpenAICompatible"]


class OpenAICompatible:
    def __init__(self, client: httpx.AsyncClient, model: str, api_key: str = "") -> None:
        self.client, self.model = client, model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def decide(self, messages: list[dict[str, str]], tools: list[ToolInfo]) -> dict[str, Any]:
        catalogue = "\n".join(f"- {t.name}: {t.description[:200]}" for t in tools) or "(no tools)"
        body = {
            "model": self.model, "temperature": 0, "max_tokens": 400,
            "messages": [{"role": "system", "content": f"Tools you may call:\n{catalogue}"}, *messages],
            "tools": [{"type": "function", "function": {"name": "decide", "description": "The next step.",
                                                        "parameters": DECISION_PARAMETERS}}],
            # Forced: the answer is a call of `decide` (servers that constrain output to the parameters'
            # schema, like llama.cpp's, then cannot write anything else).
            "tool_choice": {"type": "function", "function": {"name": "decide"}},
        }
        try:
            response = await self.client.post("/chat/completions", json=body, headers=self.headers)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise OSError(f"the model endpoint failed: {exc}") from None
        message = response.json()["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        text = calls[0]["function"]["arguments"] if calls else (message.get("content") or "")
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end < start:
            raise ValueError(f"no JSON decision in the answer: {text[:200]!r}")
        decision = json.loads(text[start:end + 1])
        if not isinstance(decision, dict):
            raise ValueError("the decision is not a JSON object")  # noqa: TRY004 - bad data, not a bug
        return decision
