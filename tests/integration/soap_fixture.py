"""Start tests/integration/soap_server.py (a real spyne SOAP server) on a free loopback port."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVER = Path(__file__).with_name("soap_server.py")


@contextmanager
def soap_server(timeout: float = 30.0) -> Iterator[str]:
    """Yield the server's base URL (http://127.0.0.1:<port>) once it listens; stop it afterwards."""
    process = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)  # bounded wait on the "PORT n" line, not a sleep
    try:
        if not line or not line[0].startswith("PORT "):
            process.kill()
            raise RuntimeError(f"the SOAP test server did not start: {process.stderr.read()[-2000:]}")
        yield f"http://127.0.0.1:{int(line[0].split()[1])}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()
        process.stderr.close()
