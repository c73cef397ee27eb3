"""MCP resources and prompts of the tool-gateway: stored results and tool usage guides. Translate only.

- resources/templates/list: `mem://step/{call_id}` (a truncated call's whole result) and
  `mem://tool/{name}/guide`;
- resources/list: the guide of every tool the caller may call;
- resources/read: a step result (the caller's tenant only) or a guide;
- prompts/list, prompts/get: one prompt per tool, named like it: its guide, then the task;
- and the resources, templates and prompts of federated upstreams (adapters/upstream_catalog.py),
  to callers holding the upstream's scopes; completion/complete asks the upstream whose prompt or
  template it names (an empty completion otherwise).
"""

from __future__ import annotations

from typing import Any, Protocol

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from libs.auth import Principal
from libs.errors import DomainError
from services.tool_gateway.domain.calls import is_call_id
from services.tool_gateway.domain.experience import Experience
from services.tool_gateway.domain.guide import GUIDE_PREFIX, guide, guide_uri
from services.tool_gateway.service_layer import experience, handlers, pipeline
from services.tool_gateway.service_layer.pipeline import CallPorts
from services.tool_gateway.service_layer.ports import ExperienceStore

__all__ = ["STEP_PREFIX", "guide_handlers"]

STEP_PREFIX = "mem://step/"
CallerOf = Any  # (ctx) -> Principal | None


class UpstreamCatalogs(Protocol):
    """adapters/upstreams.UpstreamManager: what federated upstreams offer beside tools."""

    def catalogs(self) -> list[tuple[str, Any, tuple[str, ...]]]: ...

    async def read_resource(self, upstream: str, uri: str) -> types.ReadResourceResult: ...

    async def get_prompt(self, upstream: str, name: str, arguments: dict[str, str]) -> types.GetPromptResult: ...

    async def complete(self, upstream: str, ref: Any, argument: dict[str, str],
                       context: dict[str, str] | None) -> types.CompleteResult: ...


def _allowed(caller: Principal | None, scopes: tuple[str, ...]) -> bool:
    return caller is not None and all(caller.has_scope(scope) for scope in scopes)


def _relayed(exc: Exception, upstream: str) -> MCPError:
    """An upstream's refusal or absence as this gateway's structured error (never its raw internals)."""
    if isinstance(exc, MCPError):
        reason = f"the upstream {upstream!r} refused: {exc.error.message[:200]}"
        return MCPError(exc.error.code if exc.error.code == types.INVALID_PARAMS else types.INTERNAL_ERROR, reason,
                        {"error_type": "backend_error", "field": "", "reason": reason, "retryable": False,
                         "hint": "check the name, URI or arguments against the listing"})
    reason = getattr(exc, "reason", None) or f"the upstream {upstream!r} failed ({type(exc).__name__})"
    return MCPError(types.INTERNAL_ERROR, reason, {"error_type": "unavailable", "field": "", "reason": reason,
                                                   "retryable": True, "hint": "retry with backoff"})


def _not_found(what: str, hint: str) -> MCPError:
    return MCPError(types.INVALID_PARAMS, f"no {what}",
                    {"error_type": "not_found", "field": "uri", "reason": f"no {what}", "retryable": False,
                     "hint": hint})


def guide_handlers(ports: CallPorts, store: ExperienceStore | None, caller_of: CallerOf,
                   upstreams: UpstreamCatalogs | None = None) -> dict[str, Any]:
    """The Server keyword arguments for resources, prompts and completions."""

    def catalogs(caller: Principal | None):
        return [(name, c) for name, c, scopes in (upstreams.catalogs() if upstreams else []) if _allowed(caller, scopes)]

    async def experiences(caller: Principal | None, names: list[str]) -> dict[str, Experience]:
        if store is None or caller is None:
            return {}
        return await experience.experience_notes(caller.tenant_id or pipeline.SYSTEM_TENANT, names, store)

    async def visible(caller: Principal | None, name: str):
        specs = [s for s in await handlers.list_current_tools(ports.registry, caller) if s.name == name]
        return specs[0] if specs else None

    async def list_templates(ctx: ServerRequestContext,
                             params: types.PaginatedRequestParams | None) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(name="step", uri_template="mem://step/{call_id}", mime_type="application/json",
                                   description="The whole result of a tool call whose answer was truncated "
                                               "(your tenant's only)"),
            types.ResourceTemplate(name="guide", uri_template="mem://tool/{name}/guide", mime_type="text/markdown",
                                   description="How to use a tool: arguments, examples, common errors"),
            *[t for _, c in catalogs(caller_of(ctx)) for t in c.templates]])

    async def list_resources(ctx: ServerRequestContext,
                             params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        specs = await handlers.list_current_tools(ports.registry, caller_of(ctx))
        return types.ListResourcesResult(resources=[
            types.Resource(uri=guide_uri(s.name), name=f"{s.name} guide", mime_type="text/markdown",
                           description=f"How to use {s.name}") for s in specs]
            + [r for _, c in catalogs(caller_of(ctx)) for r in c.resources])

    async def read_resource(ctx: ServerRequestContext,
                            params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        caller = caller_of(ctx)
        uri = str(params.uri)
        if uri.startswith(GUIDE_PREFIX) and uri.endswith("/guide"):
            name = uri[len(GUIDE_PREFIX):-len("/guide")]
            spec = await visible(caller, name)
            if spec is None:
                raise _not_found(f"tool {name[:128]!r} you may call", "list the resources for the guides")
            text = guide(spec, (await experiences(caller, [name])).get(name))
            return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, text=text,
                                                                                 mime_type="text/markdown")])
        if not uri.startswith(STEP_PREFIX) and upstreams is not None:
            for name, catalog in catalogs(caller):
                if catalog.serves(uri):
                    try:
                        return await upstreams.read_resource(name, uri)
                    except (MCPError, DomainError, OSError) as exc:
                        raise _relayed(exc, name) from None
        step_id = uri.removeprefix(STEP_PREFIX)
        text = None
        if caller is not None and uri.startswith(STEP_PREFIX) and is_call_id(step_id):
            text = await ports.results.get(caller.tenant_id or pipeline.SYSTEM_TENANT, step_id)
        if text is None:  # another tenant's result is as absent as an expired one
            raise _not_found(f"resource {uri[:200]}", "call the tool again (step results expire)")
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, text=text,
                                                                             mime_type="application/json")])

    async def list_prompts(ctx: ServerRequestContext,
                           params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        specs = await handlers.list_current_tools(ports.registry, caller_of(ctx))
        return types.ListPromptsResult(prompts=[
            types.Prompt(name=s.name, description=f"Use {s.name}: its guide, then your task",
                         arguments=[types.PromptArgument(name="task", description="what you want done",
                                                         required=False)]) for s in specs]
            + [p.model_copy(update={"name": exposed}) for _, c in catalogs(caller_of(ctx)) for exposed, p in c.prompts])

    async def get_prompt(ctx: ServerRequestContext, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        caller = caller_of(ctx)
        spec = await visible(caller, params.name)
        if spec is None:
            for name, catalog in catalogs(caller):
                if (prompt := catalog.prompt(params.name)) is not None:
                    try:
                        return await upstreams.get_prompt(name, prompt.name, dict(params.arguments or {}))
                    except (MCPError, DomainError, OSError) as exc:
                        raise _relayed(exc, name) from None
            raise MCPError(types.INVALID_PARAMS, f"no prompt {params.name[:128]!r}",
                           {"error_type": "not_found", "field": "name", "reason": "no such prompt",
                            "retryable": False, "hint": "list the prompts (one per tool you may call)"})
        text = guide(spec, (await experiences(caller, [spec.name])).get(spec.name))
        task = (params.arguments or {}).get("task", "")
        if task:
            text += f"\nTask: {task[:2_000]}\nCall {spec.name} with arguments that satisfy the schema above.\n"
        return types.GetPromptResult(description=f"How to use {spec.name}", messages=[
            types.PromptMessage(role="user", content=types.TextContent(text=text))])

    async def complete(ctx: ServerRequestContext, params: types.CompleteRequestParams) -> types.CompleteResult:
        ref = params.ref
        for name, catalog in catalogs(caller_of(ctx)):
            if isinstance(ref, types.PromptReference) and (prompt := catalog.prompt(ref.name)) is not None:
                ref = ref.model_copy(update={"name": prompt.name})
            elif not (isinstance(ref, types.ResourceTemplateReference) and catalog.has_template(ref.uri)):
                continue
            context = dict(params.context.arguments or {}) if params.context else None
            try:
                return await upstreams.complete(name, ref, {"name": params.argument.name,
                                                            "value": params.argument.value}, context)
            except (MCPError, DomainError, OSError) as exc:
                raise _relayed(exc, name) from None
        return types.CompleteResult(completion=types.Completion(values=[]))  # nothing to suggest

    return {"on_list_resource_templates": list_templates, "on_list_resources": list_resources,
            "on_read_resource": read_resource, "on_list_prompts": list_prompts, "on_get_prompt": get_prompt,
            "on_completion": complete}
