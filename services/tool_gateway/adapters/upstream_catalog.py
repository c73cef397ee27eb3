"""The resources, resource templates and prompts of federated upstreams, and routing to them.

Prompts are exposed under the upstream's prefix like its tools (`<prefix>.<prompt>`, at most 64
characters, unique among the names the gateway already shows); resources keep their URIs (a URI
already names one thing; the gateway's own are `mem://...`), and a read goes to the upstream that
listed the URI, or whose template matches it. An upstream's scopes guard its resources and prompts
as they guard its tools. Completions of an upstream prompt's or template's arguments are asked of it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

from services.tool_gateway.domain.naming import exposed_name

__all__ = ["Catalog", "list_catalog"]


@dataclass(frozen=True)
class Catalog:
    """What one upstream offers beside tools (empty when it declares no resources or prompts)."""

    resources: tuple[types.Resource, ...] = ()
    templates: tuple[types.ResourceTemplate, ...] = ()
    prompts: tuple[tuple[str, types.Prompt], ...] = ()  # (exposed name, the upstream's prompt)
    _parsed: tuple[UriTemplate, ...] = field(default=(), compare=False, repr=False)

    def prompt(self, exposed: str) -> types.Prompt | None:
        return next((p for name, p in self.prompts if name == exposed), None)

    def serves(self, uri: str) -> bool:
        return any(r.uri == uri for r in self.resources) or any(t.match(uri) is not None for t in self._parsed)

    def has_template(self, uri_template: str) -> bool:
        return any(t.uri_template == uri_template for t in self.templates)


async def list_catalog(client: Client, prefix: str, taken: set[str]) -> Catalog:
    """List an upstream's resources, templates and prompts (each only when its capabilities declare them)."""
    capabilities = client.server_capabilities
    resources: list[types.Resource] = []
    templates: list[types.ResourceTemplate] = []
    prompts: list[tuple[str, types.Prompt]] = []
    if capabilities.resources is not None:
        resources = list((await client.list_resources(cache_mode="bypass")).resources)
        with contextlib.suppress(MCPError):  # templates are optional even for a server with resources
            templates = list((await client.list_resource_templates(cache_mode="bypass")).resource_templates)
    if capabilities.prompts is not None:
        names = set(taken)
        for prompt in (await client.list_prompts(cache_mode="bypass")).prompts:
            name = exposed_name(prefix, prompt.name, names)
            names.add(name)
            prompts.append((name, prompt))
    parsed = []
    for template in templates:
        with contextlib.suppress(InvalidUriTemplate):
            parsed.append(UriTemplate.parse(template.uri_template))
    return Catalog(tuple(resources), tuple(templates), tuple(prompts), tuple(parsed))
