"""The real BackendLoader: zeep import in a worker thread, then a SoapEndpoint on the shared HTTP client."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from libs.errors import NotFound, ValidationFailed
from services.adapter.adapters.soap_call import CallPolicy, Credentials, SoapEndpoint
from services.adapter.adapters.soap_catalog import build_catalog
from services.adapter.adapters.soap_http import SoapHttp
from services.adapter.adapters.wsdl_import import WsdlSource, load_wsdl
from services.adapter.domain.catalog import Catalog, OperationTool
from services.adapter.domain.commands import ImportWsdl

__all__ = ["SoapBackend", "SoapLoader", "parse_credentials"]

_KINDS = ("basic", "wsse_text", "wsse_digest")


def parse_credentials(secret: SecretStr) -> dict[str, Credentials]:
    """MNEMESH_ADAPTER_CREDENTIALS -> name -> Credentials; ValidationFailed naming the bad entry."""
    raw = secret.get_secret_value().strip()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationFailed(f"is not JSON: {exc.msg} at {exc.pos}", field="MNEMESH_ADAPTER_CREDENTIALS") from None
    if not isinstance(data, dict):
        raise ValidationFailed("must be a JSON object of name -> credentials", field="MNEMESH_ADAPTER_CREDENTIALS")
    result = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or entry.get("type") not in _KINDS or not isinstance(entry.get("username"), str) \
                or not isinstance(entry.get("password"), str):
            raise ValidationFailed(f"entry {name!r} needs type ({', '.join(_KINDS)}), username and password",
                                   field="MNEMESH_ADAPTER_CREDENTIALS")
        result[name] = Credentials(entry["type"], entry["username"], entry["password"])
    return result


@dataclass
class SoapBackend:
    catalog: Catalog
    documents: dict[str, bytes]
    endpoint: SoapEndpoint

    async def invoke(self, tool: OperationTool, arguments: dict) -> dict:
        return await self.endpoint.invoke(tool, arguments)

    async def aclose(self) -> None:
        """Nothing of its own to release: the HTTP client is shared by every backend."""


class SoapLoader:
    def __init__(self, http: SoapHttp, *, credentials: dict[str, Credentials], wsdl_dir: Path,
                 concurrency: int) -> None:
        self.http, self.credentials, self.wsdl_dir, self.concurrency = http, credentials, wsdl_dir, concurrency
        self.limits: dict[str, asyncio.Semaphore] = {}

    async def load(self, command: ImportWsdl, *, revision: int, trusted: bool = False) -> SoapBackend:
        options = command.options
        credentials = None
        if options.credentials or command.backend_id in self.credentials:
            name = options.credentials or command.backend_id
            credentials = self.credentials.get(name)
            if credentials is None:
                raise NotFound(f"no credentials named {name!r} are configured", field="options.credentials",
                               hint="operators add them to MNEMESH_ADAPTER_CREDENTIALS; known: "
                                    + (", ".join(sorted(self.credentials)) or "none"))
        source = WsdlSource(url=command.url, document=command.document, path=command.path,
                            base_url=command.base_url, documents=command.documents)
        roots = None if trusted else (self.wsdl_dir,)

        def work():
            loaded = load_wsdl(source, command.backend_id, allow_remote=options.allow_remote, file_roots=roots,
                               timeout=options.timeout_seconds)
            catalog, binding = build_catalog(command.backend_id, loaded, revision=revision, service=options.service,
                                             port=options.port, address=options.address)
            return loaded, catalog, binding

        loaded, catalog, binding = await asyncio.to_thread(work)  # zeep parses synchronously
        default = CallPolicy(options.timeout_seconds, options.retries)
        policies = {name: CallPolicy(p.timeout_seconds or default.timeout_seconds,
                                     p.retries if p.retries >= 0 else default.retries)
                    for name, p in options.operations.items()}
        unknown = sorted(set(policies) - {t.operation for t in catalog.tools})
        if unknown:
            raise ValidationFailed(f"names operations the port does not have: {', '.join(unknown)}",
                                   field="options.operations")
        catalog = dataclasses.replace(catalog, tools=tuple(  # registered with the gateway with these
            dataclasses.replace(t, timeout_seconds=policies.get(t.operation, default).timeout_seconds,
                                retries=policies.get(t.operation, default).retries) for t in catalog.tools))
        endpoint = SoapEndpoint(catalog, binding, http=self.http, limits=self.limits, concurrency=self.concurrency,
                                credentials=credentials, address=options.address, policies=policies,
                                default_policy=default)
        return SoapBackend(catalog, loaded.documents, endpoint)
