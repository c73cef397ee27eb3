"""A tool's usage guide for agents: what it does, its arguments, examples, and what experience taught.

Served as the MCP resource `mem://tool/<name>/guide` and as the prompt `<name>`. No I/O.
"""

from __future__ import annotations

import json

from services.tool_gateway.domain.experience import Experience, percentile
from services.tool_gateway.domain.registry import ToolSpec

__all__ = ["GUIDE_PREFIX", "guide", "guide_uri"]

GUIDE_PREFIX = "mem://tool/"


def guide_uri(name: str) -> str:
    return f"{GUIDE_PREFIX}{name}/guide"


def _arguments(schema: dict) -> list[str]:
    required = set(schema.get("required", []))
    lines = []
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type", "any") if isinstance(prop, dict) else "any"
        text = prop.get("description", "") if isinstance(prop, dict) else ""
        lines.append(f"- `{name}` ({kind}{', required' if name in required else ''}){': ' + text if text else ''}")
    return lines or ["- none"]


def guide(spec: ToolSpec, exp: Experience | None) -> str:
    parts = [f"# {spec.name} {spec.version}", "", spec.description, "", "## Arguments", *_arguments(spec.input_schema)]
    if spec.examples:
        parts += ["", "## Examples", *(f"- `{json.dumps(e, ensure_ascii=False)[:300]}`" for e in spec.examples[:5])]
    if spec.requires:
        parts += ["", f"Call first, successfully, in the same chain (MCP `_meta` `mnemesh/chain_id`): "
                      f"{', '.join(spec.requires)}."]
    if spec.status_tool:
        parts += ["", f"Must not run twice: a call that timed out is checked with {spec.status_tool} before any "
                      "retry; do not call again after a timeout, ask it."]
    if spec.fallback:
        parts += ["", f"When it fails, the gateway tries: {', '.join(spec.fallback)}."]
    if exp is not None and exp.calls:
        parts += ["", "## Experience",
                  (f"- {exp.success_rate * 100:.0f} % of {exp.calls} calls succeeded; latency p50 "
                  f"{percentile(exp.buckets, 0.5):.0f} ms, p95 {percentile(exp.buckets, 0.95):.0f} ms")]
        for e in exp.common_errors()[:5]:
            where = f" `{e['field']}`" if e["field"] else ""
            hint = f" — {e['hint']}" if e.get("hint") else ""
            parts.append(f"- {e['count']}× {e['error_type']}{where}: {e.get('reason', '')}{hint}")
        best = exp.best_arguments()
        if best:
            parts.append("- values seen in successful calls: " + "; ".join(
                f"`{k}` = {', '.join(json.dumps(v, ensure_ascii=False) for v in vs)}" for k, vs in best.items()))
    return "\n".join(parts) + "\n"
