"""What an imported WSDL offers: one tool per operation of the chosen port. No I/O here."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

__all__ = ["Catalog", "FailedOperation", "OperationTool", "PortInfo", "describe_operation"]


@dataclass(frozen=True)
class PortInfo:
    service: str
    port: str
    binding: str
    soap_version: str  # "1.1", "1.2", or "" for a non-SOAP binding (HTTP GET/POST)
    address: str


@dataclass(frozen=True)
class OperationTool:
    name: str  # tool name, e.g. billing.get_invoice
    operation: str  # the WSDL operation name
    description: str
    input_schema: dict
    output_schema: dict
    faults: tuple[str, ...] = ()
    style: str = "document"
    soap_action: str = ""
    timeout_seconds: float = 0.0  # this operation's configured timeout; 0: the backend's default
    retries: int = -1  # likewise; -1: the backend's default


@dataclass(frozen=True)
class FailedOperation:
    operation: str
    reason: str


@dataclass(frozen=True)
class Catalog:
    backend_id: str
    wsdl_hash: str
    revision: int
    location: str
    port: PortInfo
    ports: tuple[PortInfo, ...]
    tools: tuple[OperationTool, ...]
    failed: tuple[FailedOperation, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    kind: str = "soap"  # or "com"

    def tool(self, name_or_operation: str) -> OperationTool | None:
        return self._by_name.get(name_or_operation)

    @functools.cached_property
    def _by_name(self) -> dict[str, OperationTool]:
        """Tool name and WSDL operation name -> tool, the first in order winning: built once, so a call
        looks its tool up in constant time (public WSDLs reach 1,500 operations)."""
        index: dict[str, OperationTool] = {}
        for tool in reversed(self.tools):
            index[tool.operation] = tool
            index[tool.name] = tool
        return index


def describe_operation(operation: str, service: str, documentation: str, input_schema: dict,
                       faults: tuple[str, ...]) -> str:
    """The WSDL's own words when it has some, else a sentence naming the operation and its parameters."""
    params = list(input_schema.get("properties", {}))
    if documentation:
        text = documentation
    else:
        text = f"Calls the SOAP operation {operation} of the {service} service"
        text += f" with {', '.join(params)}." if params else " (no parameters)."
    if faults:
        text += f" Declared faults: {', '.join(faults)}."
    return text[:1000]
