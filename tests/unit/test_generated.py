"""Generated artefacts are committed; these tests fail when they are stale."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from libs.events.asyncapi import render
from libs.events.schema import EVENT_TYPES, STREAMS, dead_letter_stream

ROOT = Path(__file__).resolve().parents[2]
ASYNCAPI = ROOT / "docs" / "asyncapi.json"


def test_the_committed_asyncapi_document_is_up_to_date() -> None:
    assert ASYNCAPI.read_text(encoding="utf-8") == render(), \
        "docs/asyncapi.json is stale: run `make proto` and commit the result"


def test_the_asyncapi_document_is_asyncapi_3_json() -> None:
    document = json.loads(render())
    assert document["asyncapi"] == "3.0.0"
    assert document["channels"] and document["operations"]


def test_every_event_type_appears_in_the_asyncapi_document_on_its_stream() -> None:
    document = json.loads(render())
    messages = {m["name"]: m for m in document["components"]["messages"].values()}
    assert set(messages) == set(EVENT_TYPES)
    for spec in EVENT_TYPES.values():
        headers = messages[spec.name]["headers"]["properties"]
        assert headers["event_type"] == {"const": spec.name}
        assert headers["schema_version"] == {"const": str(spec.version)}
        channel = document["channels"][spec.stream.replace(".", "_")]
        assert channel["address"] == spec.stream
        assert spec.name.replace(".", "_") in channel["messages"]


def test_every_stream_has_a_dead_letter_channel() -> None:
    addresses = {c["address"] for c in json.loads(render())["channels"].values()}
    assert addresses == set(STREAMS) | {dead_letter_stream(s) for s in STREAMS}


def test_every_payload_schema_reference_resolves() -> None:
    document = json.loads(render())
    schemas = document["components"]["schemas"]
    refs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            refs.extend(v for k, v in node.items() if k == "$ref" and v.startswith("#/components/schemas/"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    assert refs
    assert {r.removeprefix("#/components/schemas/") for r in refs} <= set(schemas)


def test_the_generated_protobuf_code_is_up_to_date() -> None:
    result = subprocess.run([sys.executable, "scripts/gen_protos.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=100, check=False)
    assert result.returncode == 0, f"{result.stderr.strip()}\n{result.stdout.strip()}"
