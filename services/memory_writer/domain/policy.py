"""A deployment's write rules, read from its settings once and passed to the write pipeline."""

from __future__ import annotations

from dataclasses import dataclass

from services.memory_writer.domain.guard import BURST_LIMIT

__all__ = ["DEFAULT_POLICY", "WritePolicy"]


@dataclass(frozen=True)
class WritePolicy:
    burst_limit: int = BURST_LIMIT  # writes of one user per minute before the guard quarantines the rest
    # Tenants whose phone numbers and e-mail addresses are sensitive (sealed, redacted, hashed like IDs and
    # cards); "*" means every tenant.
    sensitive_contacts: frozenset[str] = frozenset()

    def contacts_sensitive(self, tenant_id: str) -> bool:
        return "*" in self.sensitive_contacts or tenant_id in self.sensitive_contacts

    @classmethod
    def of(cls, burst_limit: int, sensitive_contacts: str) -> WritePolicy:
        """From the settings: `sensitive_contacts` is a comma-separated list of tenant ids, or "*"."""
        return cls(burst_limit, frozenset(t.strip() for t in sensitive_contacts.split(",") if t.strip()))


DEFAULT_POLICY = WritePolicy()
