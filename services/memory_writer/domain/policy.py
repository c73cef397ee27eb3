"""A deployment's write rules, read from its settings once and passed to the write pipeline; a tenant's
own rules (stored, set over gRPC) take precedence for that tenant (`for_tenant`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from services.memory_writer.domain.guard import BURST_LIMIT

__all__ = ["DEFAULT_POLICY", "WritePolicy"]


@dataclass(frozen=True)
class WritePolicy:
    burst_limit: int = BURST_LIMIT  # writes of one user per minute before the guard quarantines the rest
    # Tenants whose phone numbers and e-mail addresses are sensitive (sealed, redacted, hashed like IDs and
    # cards); "*" means every tenant.
    sensitive_contacts: frozenset[str] = frozenset()
    plain_contacts: frozenset[str] = frozenset()  # tenants whose own rule says their contacts are not sensitive

    def contacts_sensitive(self, tenant_id: str) -> bool:
        if tenant_id in self.plain_contacts:
            return False
        return "*" in self.sensitive_contacts or tenant_id in self.sensitive_contacts

    def for_tenant(self, tenant_id: str, contacts_sensitive: bool | None) -> WritePolicy:
        """These rules with the tenant's own contacts rule (None: it has none; the deployment's applies)."""
        if contacts_sensitive is None:
            return self
        if contacts_sensitive:
            return replace(self, sensitive_contacts=self.sensitive_contacts | {tenant_id},
                           plain_contacts=self.plain_contacts - {tenant_id})
        return replace(self, plain_contacts=self.plain_contacts | {tenant_id})

    @classmethod
    def of(cls, burst_limit: int, sensitive_contacts: str) -> WritePolicy:
        """From the settings: `sensitive_contacts` is a comma-separated list of tenant ids, or "*"."""
        return cls(burst_limit, frozenset(t.strip() for t in sensitive_contacts.split(",") if t.strip()))


DEFAULT_POLICY = WritePolicy()
