"""Child processes of `mnemesh run`: tied to the parent's life, recorded, and found again.

Every child is started through `setpriv --pdeathsig`, so it is signalled when its
parent dies, even by SIGKILL (the kernel does it; nothing has to run in the
parent). Children must be started from the main thread: the signal follows the
thread that forked. Each embedded server also leaves a pid file, so a leftover
from a run that was killed some other way is found and stopped at the next start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

__all__ = ["guarded", "reap_leftover", "write_pidfile"]


def guarded(cmd: list[str], *, on_parent_death: str = "TERM", user: tuple[int, int] | None = None) -> list[str]:
    """`cmd` prefixed to die with its parent and, given `user` (uid, gid), to run as that user."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        if user is not None:
            raise FileNotFoundError("setpriv (util-linux) is needed to run a child as another user")
        return cmd
    prefix = [setpriv, f"--pdeathsig={on_parent_death}"]
    if user is not None:
        prefix += [f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups"]
    return [*prefix, "--", *cmd]


def write_pidfile(path: Path, pid: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{pid}\n")


def reap_leftover(path: Path, marker: str, timeout: float = 5.0) -> int | None:
    """Stop the process named in pid file `path` if it still runs and its command line holds `marker`.

    Returns the pid stopped, or None. The marker (the data folder) keeps us from
    touching an unrelated process that reused the pid.
    """
    try:
        pid = int(path.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return None
    if marker not in cmdline:
        path.unlink(missing_ok=True)
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return pid
