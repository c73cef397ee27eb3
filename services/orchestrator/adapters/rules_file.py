"""The rule book from a file, reloaded when the file changes, without a restart.

A changed file that does not parse or names something wrong is refused: the error (line and
reason) is logged and kept in `last_error`, and the rules in use stay as they were.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from libs.logs import get_logger
from services.orchestrator.domain.rulebook import RuleBook, RulesError, parse_rulebook

__all__ = ["DEFAULT_RULES", "RulesFile"]

log = get_logger(__name__)
DEFAULT_RULES = Path(__file__).resolve().parent.parent / "config" / "rules.yaml"


class RulesFile:
    def __init__(self, path: Path = DEFAULT_RULES) -> None:
        self.path = path
        self.last_error: RulesError | None = None
        self._stamp = self._read_stamp()
        self.book = parse_rulebook(path.read_text(encoding="utf-8"))  # at start a bad file is fatal

    def __call__(self) -> RuleBook:
        return self.book

    def _read_stamp(self) -> tuple[int, int]:
        stat = self.path.stat()
        return stat.st_mtime_ns, stat.st_size

    def reload_if_changed(self) -> bool:
        """Load the file again if it changed; True when new rules are in use."""
        try:
            stamp = self._read_stamp()
        except FileNotFoundError:
            return False  # being replaced (write-then-rename): try at the next check
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            book = parse_rulebook(self.path.read_text(encoding="utf-8"))
        except RulesError as exc:
            self.last_error = exc
            log.error("rules file refused; the previous rules stay", path=str(self.path), line=exc.line,
                      reason=exc.reason)
            return False
        except (OSError, UnicodeDecodeError) as exc:
            log.error("rules file unreadable; the previous rules stay", path=str(self.path), error=str(exc))
            return False
        self.book, self.last_error = book, None
        log.info("rules reloaded", path=str(self.path), rules=len(book.rules), intents=len(book.intents))
        return True

    async def watch(self, every_seconds: float = 1.0) -> None:
        """Check the file for changes every `every_seconds`, forever (a service task)."""
        while True:
            self.reload_if_changed()
            await asyncio.sleep(every_seconds)
