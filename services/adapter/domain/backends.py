"""Legacy backends the adapter bridges (SOAP services by WSDL, COM objects on Windows)."""

from __future__ import annotations

from dataclasses import dataclass

from libs.errors import ValidationFailed

__all__ = ["Backend", "parse_backends"]

KINDS = ("soap", "com")


@dataclass(frozen=True)
class Backend:
    backend_id: str
    kind: str
    location: str  # WSDL URL or file for soap, ProgID for com


def parse_backends(spec: str) -> list[Backend]:
    """Parse `id=kind:location,...` (the MNEMESH_ADAPTER_BACKENDS setting)."""
    backends = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        backend_id, sep, rest = (part.strip() for part in item.partition("="))
        kind, colon, location = (part.strip() for part in rest.partition(":"))
        if not sep or not colon or not backend_id or not location:
            raise ValidationFailed(f"entry {item!r} is not id=kind:location", field="MNEMESH_ADAPTER_BACKENDS",
                                   hint="e.g. billing=soap:file:///srv/billing.wsdl")
        if kind not in KINDS:
            raise ValidationFailed(f"kind {kind!r} of {backend_id!r} is unknown", field="MNEMESH_ADAPTER_BACKENDS",
                                   hint=f"use one of {', '.join(KINDS)}")
        backends.append(Backend(backend_id, kind, location))
    ids = [b.backend_id for b in backends]
    if len(ids) != len(set(ids)):
        raise ValidationFailed("backend ids must be unique", field="MNEMESH_ADAPTER_BACKENDS")
    return backends
