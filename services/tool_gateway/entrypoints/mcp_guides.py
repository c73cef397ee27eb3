"""MCP resources and prompts of the tool-gateway: stored results and tool usage guides. Translate only.

- resources/templates/list: `mem://step/{call_id}` (a truncated call's whole result) and
  `mem://tool/{name}/guide`;
- resources/list: the guide of every tool the caller may call;
- resources/read: a step result (the caller's tenant only) or a guide;
- prompts/list, prompts/get: one prompt per tool, named like it: its guide, then the task.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from libs.auth import Principal
from services.tool_gateway.domain.experience import Experience
from services.tool_gateway.domain.guide import GUIDE_PREFIX, guide, guide_uri
from services.tool_gateway.service_layer import experience, handlers, pipeline
from services.tool_gateway.service_layer.pipeline import CallPorts
from services.tool_gateway.service_layer.ports import ExperienceStore

__all__ = ["STEP_PREFIX", "guide_handlers"]

STEP_PREFIX = "mem://step/"
CallerOf = Any  # (ctx) -> Principal | None


def _not_found(what: str, hint: str) -> MCPError:
    return MCPError(types.INVALID_PARAMS, f"no {what}",
                    {"error_type": "not_found", "field": "uri", "reason": f"no {what}", "retryable": False,
                     "hint": hint})


def guide_handlers(ports: CallPorts, store: ExperienceStore | None, caller_of: CallerOf) -> dict[str, Any]:
    """The Server keyword arguments for resources and prompts."""

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
                                   description="How to use a tool: arguments, examples, common errors")])

    async def list_resources(ctx: ServerRequestContext,
                             params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        specs = await handlers.list_current_tools(ports.registry, caller_of(ctx))
        return types.ListResourcesResult(resources=[
            types.Resource(uri=guide_uri(s.name), name=f"{s.name} guide", mime_type="text/markdown",
                           description=f"How to use {s.name}") for s in specs])

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
        step_id = uri.removeprefix(STEP_PREFIX)
        text = None
        if caller is not None and uri.startswith(STEP_PREFIX) and step_id:
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
                                                         required=False)]) for s in specs])

    async def get_prompt(ctx: ServerRequestContext, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        caller = caller_of(ctx)
        spec = await visible(caller, params.name)
        if spec is None:
            raise MCPError(types.INVALID_PARAMS, f"no prompt {params.name[:128]!r}",
                           {"error_type": "not_found", "field": "name", "reason": "no such prompt",
                            "retryable": False, "hint": "list the prompts (one per tool you may call)"})
        text = guide(spec, (await experiences(caller, [spec.name])).get(spec.name))
        task = (params.arguments or {}).get("task", "")
        if task:
            text += f"\nTask: {task[:2_000]}\nCall {spec.name} with arguments that satisfy the schema above.\n"
        return types.GetPromptResult(description=f"How to use {spec.name}", messages=[
            types.PromptMessage(role="user", content=types.TextContent(text=text))])

    return {"on_list_resource_templates": list_templates, "on_list_resources": list_resources,
            "on_read_resource": read_resource, "on_list_prompts": list_prompts, "on_get_prompt": get_prompt}
