"""Child processes of `mnemesh run`: tied to the parent's life, recorded, and found again.

Every child is started through `setpriv --pdeathsig`, so it is signalled when its
parent dies, even by SIGKILL (the kernel does it; nothing has to run in the
parent). Children must be started from the main thread: the signal follows the
thread that forked. Each embedded server also leaves a pid file, so a leftover
from a run that was killed some other way is found and stopped at the next start.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import time
from pathlib import Path

__all__ = ["DataFolderBusy", "data_folder_lock", "guarded", "reap_leftover", "write_pidfile"]


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


def _start_time(pid: int) -> str | None:
    """The start time of a live process in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return None if fields[0] == "Z" else fields[19]  # a zombie has exited already


def write_pidfile(path: Path, pid: int) -> None:
    """Record `pid` with its start time, so a later reader cannot mistake a reused pid for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{pid} {_start_time(pid) or ''}\n")


def reap_leftover(path: Path, stop_signal: int = signal.SIGTERM, timeout: float = 5.0) -> int | None:
    """Stop the process recorded in pid file `path` if that very process still runs; return its pid."""
    try:
        pid_text, _, started = path.read_text().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return None
    if not started or _start_time(pid) != started:
        path.unlink(missing_ok=True)
        return None  # gone, or the pid now belongs to another process
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, stop_signal)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _start_time(pid) == started:
            time.sleep(0.1)
        if _start_time(pid) == started:
            os.kill(pid, signal.SIGKILL)
            while _start_time(pid) == started and time.monotonic() < deadline + 5:
                time.sleep(0.1)
    path.unlink(missing_ok=True)
    return pid


@contextlib.contextmanager
def data_folder_lock(data_dir: Path, holder: str = "mnemesh run"):
    """Hold `data_dir` for this process; a second holder gets a clear refusal naming the first."""
    path = data_dir.resolve() / "run" / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            owner = lock.read().strip() or "?"
            raise DataFolderBusy(f"another `{holder}` (pid {owner}) is using the data folder {data_dir.resolve()}: "
                                 "stop it first (Ctrl-C in its terminal), or set MNEMESH_DATA_DIR to another "
                                 "folder") from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield


class DataFolderBusy(Exception):
    pass
