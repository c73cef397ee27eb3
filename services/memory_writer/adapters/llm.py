"""An OpenAI-compatible chat endpoint as the Summarizer port (abstractive and hybrid compression)."""

from __future__ import annotations

import httpx

from libs.errors import Unavailable

__all__ = ["OpenAICompatibleSummarizer"]

_PROMPT = ("Summarise this conversation for an assistant's memory. Keep every name, number, date, amount, "
           "decision and request exactly as written; drop small talk. Answer with the summary only, in the "
           "conversation's language.")


class OpenAICompatibleSummarizer:
    def __init__(self, base_url: str, model: str, api_key: str = "", *, timeout: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.client = httpx.AsyncClient(base_url=base_url.rstrip("/") + "/", headers=headers, timeout=timeout,
                                        transport=transport)

    async def summarize(self, text: str, max_tokens: int) -> str:
        try:
            reply = await self.client.post("chat/completions", json={
                "model": self.model, "max_tokens": max_tokens, "temperature": 0,
                "messages": [{"role": "system", "content": _PROMPT}, {"role": "user", "content": text}]})
            reply.raise_for_status()
            return reply.json()["choices"][0]["message"]["content"].strip()
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise Unavailable(f"the LLM endpoint failed: {type(exc).__name__}", hint="retry, or use extractive") \
                from exc

    async def close(self) -> None:
        await self.client.aclose()
