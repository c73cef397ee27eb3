"""Plain HTTP/JSON APIs as tools: an OpenAPI 3 document, or one URL template. No I/O here.

Each operation of the document becomes one tool on the gateway's HTTP backend:
- name: `<prefix>.<operationId>` in snake case (or `<method>_<path>` without an operationId), a valid
  registry name of at most 64 characters, unique in the document (domain/naming.py);
- input schema: an object whose properties are the path and query parameters (path ones required)
  and, for a JSON request body that is an object, the body's properties (its `required` kept);
  local `$ref`s resolved; OpenAPI 3.0 keywords turned into JSON Schema 2020-12 (`nullable`, boolean
  `exclusiveMinimum`/`exclusiveMaximum`);
- backend: `http:<METHOD> <base><path>{?query,...}`: path parameters fill their placeholders, the
  query parameters present in a call go in the query string (RFC 6570 form-style), the body's
  properties are the JSON body (backends/http.py).

An operation that cannot be called that way is skipped with the reason: a required header or
cookie parameter, a body that is not a JSON object, a name both in the parameters and the body,
a `$ref` outside the document or one that refers to itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from libs.errors import ValidationFailed
from services.tool_gateway.domain.naming import exposed_name
from services.tool_gateway.domain.registry import ToolSpec

__all__ = ["Skipped", "ToolsFromOpenApi", "template_schema", "tools_from_openapi"]

_METHODS = ("get", "put", "post", "delete", "patch")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_PATH_PARAM = re.compile(r"\{([^}]+)\}")
_QUERY_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_MAX_REF_DEPTH = 32


class _Unsupported(Exception):
    """Why one operation cannot become a tool."""


@dataclass(frozen=True)
class Skipped:
    operation: str  # "GET /customers/{id}"
    reason: str


@dataclass
class ToolsFromOpenApi:
    tools: list[ToolSpec] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def _resolve(document: dict, value: Any, depth: int = 0) -> Any:
    """`value` with every local `$ref` replaced by what it points to (components, paths)."""
    if depth > _MAX_REF_DEPTH:
        raise _Unsupported("a $ref refers to itself (a recursive schema)")
    if isinstance(value, dict):
        if "$ref" in value:
            ref = value["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#/"):
                raise _Unsupported(f"the $ref {str(ref)[:80]!r} points outside the document")
            target: Any = document
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise _Unsupported(f"the $ref {ref[:80]!r} points nowhere")
                target = target[part]
            return _resolve(document, target, depth + 1)
        return {k: _resolve(document, v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(document, v, depth + 1) for v in value]
    return value


def _json_schema(schema: Any) -> Any:
    """OpenAPI 3.0 schema keywords as JSON Schema 2020-12 (3.1 schemas pass unchanged)."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _json_schema(v) for k, v in schema.items()
           if k not in ("nullable", "example", "xml", "externalDocs", "discriminator")}
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), bool):  # 3.0: a flag on minimum/maximum; 2020-12: the number itself
            if out.pop(bound) and limit in out:
                out[bound] = out.pop(limit)
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _placeholder(name: str) -> str:
    """A path parameter's argument name: the parameter's own, or made an identifier (placeholders are
    filled by position in the template, so renaming them changes nothing on the wire)."""
    word = _IDENTIFIER.sub("_", name)
    return word if word[:1].isalpha() or word[:1] == "_" else f"p_{word}"


def _operation(document: dict, path: str, method: str, item: dict, op: dict,
               base_url: str) -> tuple[str, dict, str]:
    """(description, input schema, backend target) of one operation."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    query: list[str] = []
    template = path
    params = {(p["name"], p["in"]): p for p in (_resolve(document, p) for p in
                                               [*item.get("parameters", []), *op.get("parameters", [])])}
    for (name, where), param in params.items():
        schema = _json_schema(param.get("schema") or {"type": "string"})
        if param.get("description") and isinstance(schema, dict):
            schema = {**schema, "description": str(param["description"])[:500]}
        if where == "path":
            arg = _placeholder(name)
            template = template.replace("{" + name + "}", "{" + arg + "}")
            properties[arg] = schema
            required.append(arg)
        elif where == "query":
            if not _QUERY_NAME.fullmatch(name):
                raise _Unsupported(f"the query parameter {name!r} has characters a URL template cannot name")
            properties[name] = schema
            query.append(name)
            if param.get("required"):
                required.append(name)
        elif param.get("required"):
            raise _Unsupported(f"it needs the {where} parameter {name!r}, which the HTTP backend cannot send")
    missing = [p for p in _PATH_PARAM.findall(template) if p not in properties]
    if missing:
        raise _Unsupported(f"the path parameter {missing[0]!r} is not declared")
    body = _resolve(document, op.get("requestBody") or {})
    if body:
        media = body.get("content", {}).get("application/json")
        schema = _json_schema((media or {}).get("schema") or {})
        if media is None or schema.get("type", "object") != "object" or "properties" not in schema:
            if body.get("required") or media is None:
                raise _Unsupported("its request body is not a JSON object with properties")
        else:
            clash = sorted(set(schema["properties"]) & set(properties))
            if clash:
                raise _Unsupported(f"{clash[0]!r} is both a parameter and a body property")
            properties.update(schema["properties"])
            required += [r for r in schema.get("required", []) if r in schema["properties"]]
    input_schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        input_schema["required"] = required
    words = op.get("summary") or op.get("description") or item.get("summary") or ""
    description = f"{method.upper()} {path}" + (f": {str(words).strip()}" if words else "")
    target = f"http:{method.upper()} {base_url.rstrip('/')}{template}" + (f"{{?{','.join(query)}}}" if query else "")
    return description[:1000], input_schema, target


def _base_url(document: dict, base_url: str) -> str:
    if base_url:
        return base_url
    servers = document.get("servers") or []
    if servers and isinstance(servers[0], dict):
        url = str(servers[0].get("url", ""))
        for name, var in (servers[0].get("variables") or {}).items():
            url = url.replace("{" + name + "}", str(var.get("default", "")))
        if url.startswith(("http://", "https://")):
            return url
    raise ValidationFailed("names no absolute server URL", field="servers",
                           hint="pass the API's base URL (mnemesh tools register --openapi FILE --base-url URL)")


def tools_from_openapi(document: dict, *, prefix: str = "", base_url: str = "", version: str = "",
                       scopes: tuple[str, ...] = (), timeout_seconds: float = 10.0) -> ToolsFromOpenApi:
    """Every operation of an OpenAPI 3 `document` as a tool spec, or skipped with the reason."""
    if not str(document.get("openapi", "")).startswith("3."):
        raise ValidationFailed("is not an OpenAPI 3 document (no `openapi: 3.x` field)", field="openapi",
                               hint="convert a Swagger 2.0 document to OpenAPI 3 first")
    base = _base_url(document, base_url)
    info_version = str((document.get("info") or {}).get("version", ""))
    version = version or (info_version if _VERSION.match(info_version) else "1.0.0")
    found, taken = ToolsFromOpenApi(), set()
    for path, item in (document.get("paths") or {}).items():
        if not isinstance(item, dict):
            continue
        for method in _METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            label = f"{method.upper()} {path}"
            try:
                description, schema, target = _operation(document, path, method, item, op, base)
            except _Unsupported as exc:
                found.skipped.append(Skipped(label, str(exc)))
                continue
            word = _CAMEL.sub("_", str(op.get("operationId") or f"{method}_{path}"))
            name = exposed_name(prefix, word, taken)
            taken.add(name)
            found.tools.append(ToolSpec(name=name, description=description, input_schema=schema, version=version,
                                        scopes=scopes, timeout_seconds=timeout_seconds, backend=target))
    return found


def template_schema(target: str) -> dict[str, Any]:
    """The input schema a URL template implies: each `{name}` a required string, each name of a
    `{?a,b}` query expansion an optional one."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for expression in _PATH_PARAM.findall(target):
        if expression.startswith("?"):
            for name in expression[1:].split(","):
                properties.setdefault(name.strip(), {"type": "string"})
        else:
            properties[expression] = {"type": "string"}
            required.append(expression)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema
