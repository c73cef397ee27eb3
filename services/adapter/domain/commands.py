"""The adapter's commands: small typed records, validated at the edge. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.errors import ValidationFailed
from services.adapter.domain.naming import check_backend_id

__all__ = ["DescribeBackend", "DropBackend", "ImportOptions", "ImportWsdl", "InvokeOperation", "OperationPolicy"]


@dataclass(frozen=True)
class OperationPolicy:
    timeout_seconds: float = 0.0  # 0: the import's default
    retries: int = -1  # -1: the import's default


@dataclass(frozen=True)
class ImportOptions:
    service: str = ""
    port: str = ""
    address: str = ""  # overrides the WSDL's soap:address
    allow_remote: bool = False  # fetch imports from other hosts than the WSDL's
    credentials: str = ""  # a name in MNEMESH_ADAPTER_CREDENTIALS (never the secret itself)
    timeout_seconds: float = 30.0
    retries: int = 0
    operations: dict[str, OperationPolicy] = field(default_factory=dict)

    def check(self) -> ImportOptions:
        if not 0 < self.timeout_seconds <= 600:
            raise ValidationFailed("must be between 0 and 600 seconds", field="options.timeout_seconds")
        if not 0 <= self.retries <= 5:
            raise ValidationFailed("must be between 0 and 5", field="options.retries")
        for name, policy in self.operations.items():
            if policy.timeout_seconds and not 0 < policy.timeout_seconds <= 600:
                raise ValidationFailed("must be between 0 and 600 seconds",
                                       field=f"options.operations.{name}.timeout_seconds")
            if policy.retries > 5:
                raise ValidationFailed("must be at most 5", field=f"options.operations.{name}.retries")
        if self.address and not self.address.startswith(("http://", "https://")):
            raise ValidationFailed("must be an http(s) URL", field="options.address")
        return self

    def to_json(self) -> dict:
        return {"service": self.service, "port": self.port, "address": self.address,
                "allow_remote": self.allow_remote, "credentials": self.credentials,
                "timeout_seconds": self.timeout_seconds, "retries": self.retries,
                "operations": {k: {"timeout_seconds": v.timeout_seconds, "retries": v.retries}
                               for k, v in self.operations.items()}}

    @classmethod
    def from_json(cls, data: dict) -> ImportOptions:
        ops = {k: OperationPolicy(**v) for k, v in (data.get("operations") or {}).items()}
        return cls(**{**{k: v for k, v in data.items() if k != "operations"}, "operations": ops})


@dataclass(frozen=True)
class ImportWsdl:
    backend_id: str
    url: str = ""
    document: bytes = b""
    path: str = ""
    base_url: str = ""
    documents: dict[str, bytes] = field(default_factory=dict)
    options: ImportOptions = field(default_factory=ImportOptions)

    def check(self) -> ImportWsdl:
        check_backend_id(self.backend_id)
        if sum(map(bool, (self.url, self.document, self.path))) != 1:
            raise ValidationFailed("give exactly one of url, document or path", field="source",
                                   hint="url: fetched by the adapter; document: the WSDL text; "
                                        "path: a file under MNEMESH_ADAPTER_WSDL_DIR")
        if len(self.documents) > 200 or sum(map(len, self.documents.values())) + len(self.document) > 20_000_000:
            raise ValidationFailed("at most 200 documents and 20 MB in all", field="documents")
        self.options.check()
        return self


@dataclass(frozen=True)
class InvokeOperation:
    backend_id: str
    operation: str  # the tool name or the WSDL operation name
    arguments: dict

    def check(self) -> InvokeOperation:
        check_backend_id(self.backend_id)
        if not self.operation:
            raise ValidationFailed("is required", field="operation", hint="Describe lists the operations")
        return self


@dataclass(frozen=True)
class DropBackend:
    backend_id: str


@dataclass(frozen=True)
class DescribeBackend:
    backend_id: str
