"""The directly built memory.written payload prints byte for byte as protobuf's printer would."""

from __future__ import annotations

import itertools
import json
import random
from datetime import UTC, datetime, timedelta, timezone

from google.protobuf import json_format

from libs.protogen.mnemesh.v1 import events_pb2
from services.memory_writer.adapters.event_json import written_payload
from services.memory_writer.adapters.mapping import memory_to_proto
from services.memory_writer.domain import Confidence, Layer, MemoryRecord, Source, Status


def _protobuf(record: MemoryRecord) -> str:
    return json_format.MessageToJson(events_pb2.MemoryWritten(memory=memory_to_proto(record, sealed=True), version=1),
                                     indent=None)


def _records() -> list[MemoryRecord]:
    rng = random.Random(7)
    base = datetime(2026, 3, 1, 12, 30, 5, tzinfo=UTC)
    times = [base, base.replace(microsecond=250000), base.replace(microsecond=123456),
             datetime(2026, 3, 1, 20, 0, 0, 1000, tzinfo=timezone(timedelta(hours=8)))]
    records = []
    for i, (layer, source, confidence, status) in enumerate(itertools.product(
            [*Layer], [*Source], [*Confidence], [*Status])):
        sensitive = i % 3 == 0
        records.append(MemoryRecord(
            memory_id=f"m-{i}" if i % 7 else "", tenant_id="t1", user_id="" if i % 11 == 0 else f"用户{i}",
            session_id="s1" if i % 2 else "", layer=layer, source=source,
            content=rng.choice(["likes \"green\" tea\n\t", "喜欢绿茶 😀", "", "a\\b </script>"]),
            key="user.phone" if i % 4 == 0 else "", confidence=confidence,
            tags=tuple(rng.sample(["a", "标签", "x y"], k=i % 3)), derived_from=("d1",) if i % 5 == 0 else (),
            step_id="step" if i % 6 == 0 else "", created_at=times[i % len(times)],
            expires_at=times[(i + 1) % len(times)] if i % 2 else None, idempotency_key="",
            attributes={}, engagement=[0.0, 1.0, 2.5, 1e-7, 3.0000000000000004][i % 5], status=status,
            sensitive_kind="card" if sensitive else "", redacted="card [sensitive:card]" if sensitive else "",
            sensitive_hashes=("ab" * 32,) if sensitive else (), sealed=bytes(range(i % 40)) if sensitive else b"",
            near_duplicate_of="m-0" if i % 9 == 0 else "", merged_count=i % 3))
    return records


def test_the_direct_payload_prints_exactly_as_protobuf_does_for_every_kind_of_record() -> None:
    records = _records()
    assert len(records) > 100
    for record in records:
        js = written_payload(record)
        assert js is not None
        assert json.dumps(js) == _protobuf(record), record


def test_records_the_direct_path_does_not_cover_are_left_to_protobuf() -> None:
    record = _records()[1]
    assert written_payload(record.__class__(**{**record.__dict__, "attributes": {"n": 3}})) is None
    assert written_payload(record.__class__(**{**record.__dict__, "engagement": float("nan")})) is None
    assert written_payload(record.__class__(**{**record.__dict__, "engagement": -0.0})) is None
