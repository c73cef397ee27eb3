"""Slot validators: find a value in what the user wrote, and say precisely why a value is not one.

Every pattern is RE2 (linear time), whatever the rules file asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from libs.safe_schema import compile_pattern

__all__ = ["VALIDATORS", "SlotValidator", "pattern_validator"]


@dataclass(frozen=True)
class SlotValidator:
    name: str
    find: str         # RE2: candidates in a message (broad, so near-misses are caught and explained)
    valid: str        # RE2: the whole value must match
    reason: str       # why a candidate is refused, to relay to the user
    normalise_digits: bool = False

    def extract(self, text: str) -> tuple[str | None, str | None]:
        """(a valid value, or None; the reason a candidate was refused, or None when there was none)."""
        refused = None
        for match in compile_pattern(self.find).finditer(text):
            value = match.group(0).strip()
            problem = self.check(value)
            if problem is None:
                return self.clean(value), None
            refused = problem
        return None, refused

    def clean(self, value: str) -> str:
        return "".join(c for c in value if c.isdigit()) if self.normalise_digits else value.strip()

    def check(self, value: str) -> str | None:
        value = self.clean(value)
        if compile_pattern(f"^(?:{self.valid})$").search(value) is None:
            return self.reason
        if self.name == "date":
            try:
                date.fromisoformat(value)
            except ValueError:
                return "the date must exist, as YYYY-MM-DD"
        return None


def pattern_validator(name: str, pattern: str, reason: str) -> SlotValidator:
    compile_pattern(pattern)  # raises UnsupportedPattern for a non-linear pattern
    return SlotValidator(name, pattern, pattern, reason)


VALIDATORS: dict[str, SlotValidator] = {v.name: v for v in [
    SlotValidator("phone", r"\+?\d[\d -]{6,16}\d", r"1[3-9]\d{9}",
                  "phone number must be 11 digits starting with 1", normalise_digits=True),
    SlotValidator("email", r"[^\s@,，]+@[^\s@,，]+", r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+",
                  "the e-mail address must look like name@example.com"),
    SlotValidator("date", r"\d{4}-\d{1,2}-\d{1,2}", r"\d{4}-\d{2}-\d{2}", "the date must be YYYY-MM-DD"),
    SlotValidator("amount", r"\d+(?:\.\d+)?", r"\d{1,12}(?:\.\d{1,2})?",
                  "the amount must be a number with at most two decimals"),
    SlotValidator("order_id", r"(?i)\b[A-Z]{1,3}-?\d{1,12}\b", r"[A-Za-z]{1,3}-?\d{4,10}",
                  "an order number is 1-3 letters and 4-10 digits, e.g. A12345"),
]}
