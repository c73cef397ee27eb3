"""How a result made of MCP content blocks (images, audio, embedded resources) crosses the pipeline.

The pipeline carries results as JSON objects. An upstream MCP tool that answers with media rather
than text or structured content is carried as `{"content": [<MCP content blocks as JSON>]}`: gRPC
callers get that object, and the MCP entry point answers the blocks themselves again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MEDIA_KEY", "media_blocks"]

MEDIA_KEY = "content"
_BLOCK_TYPES = frozenset({"text", "image", "audio", "resource", "resource_link"})


def media_blocks(value: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The content blocks a result carries, or None when it is an ordinary object."""
    blocks = value.get(MEDIA_KEY) if len(value) == 1 else None
    if isinstance(blocks, list) and blocks and all(
            isinstance(b, dict) and b.get("type") in _BLOCK_TYPES for b in blocks):
        return blocks
    return None
