"""A one-line progress bar on stderr for long commands (ingest, rebuild); quiet when stderr is no terminal,
except for the final state."""

from __future__ import annotations

import sys

__all__ = ["progress_bar"]


def progress_bar(label: str, done: int, total: int, width: int = 30) -> None:
    if sys.stderr.isatty() or done >= total:
        bar = "#" * int(width * min(done, total) / max(total, 1))
        print(f"\r{label:<10} [{bar:<{width}}] {done}/{total}", end="\n" if done >= total else "", file=sys.stderr,
              flush=True)
