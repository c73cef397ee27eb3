"""The adapter end to end against a real SOAP server (spyne): import by URL, store, call, errors, gRPC."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from google.protobuf import json_format
from soap_fixture import soap_server

from libs.db import Database, apply_migrations, load_migrations
from libs.errors import DeadlineExceeded, Unauthenticated, Unavailable, ValidationFailed
from libs.protogen.mnemesh.v1 import tools_pb2, tools_pb2_grpc
from libs.rpc import GrpcServer, channel
from mnemesh.infra import free_port
from services.adapter.adapters.gateway import tool_specs
from services.adapter.adapters.postgres import PostgresBackendStore
from services.adapter.adapters.soap_backend import SoapLoader
from services.adapter.adapters.soap_call import Credentials
from services.adapter.adapters.soap_http import SoapHttp
from services.adapter.domain.commands import (
    DropBackend,
    ImportOptions,
    ImportWsdl,
    InvokeOperation,
    OperationPolicy,
)
from services.adapter.domain.errors import BackendFault, BadResponse
from services.adapter.entrypoints import grpc_api
from services.adapter.service_layer import handlers
from services.adapter.service_layer.handlers import Bridge

pytestmark = pytest.mark.integration


class RecordingRegistry:
    def __init__(self) -> None:
        self.registered: list[tuple[str, str]] = []
        self.removed: list[str] = []

    async def register(self, catalog, timeout_seconds, retries) -> str:
        self.registered += [(t.name, catalog.wsdl_hash) for t in catalog.tools]
        return ""

    async def unregister(self, names) -> str:
        self.removed += names
        return ""


@pytest.fixture(scope="module")
def soap_url() -> Iterator[str]:
    with soap_server() as url:
        yield url


@pytest.fixture
async def bridge(database_url: str, schema: str, db: Database, tmp_path) -> AsyncIterator[Bridge]:
    await apply_migrations(database_url, schema, load_migrations("services.adapter"))
    credentials = {"clerk_basic": Credentials("basic", "clerk", "s3cret"),
                   "clerk_digest": Credentials("wsse_digest", "clerk", "s3cret"),
                   "clerk_text": Credentials("wsse_text", "clerk", "s3cret"),
                   "wrong": Credentials("wsse_text", "clerk", "nope")}
    http = SoapHttp()
    yield Bridge(PostgresBackendStore(db), SoapLoader(http, credentials=credentials, wsdl_dir=tmp_path,
                                                      concurrency=4), RecordingRegistry())
    await http.aclose()


async def call(bridge: Bridge, operation: str, backend: str = "billing", **arguments) -> dict:
    return await handlers.invoke(InvokeOperation(backend, operation, arguments), bridge)


@pytest.mark.parametrize("path", ["soap11", "soap12"])
async def test_a_wsdl_imported_by_url_is_called_end_to_end(bridge: Bridge, soap_url: str, path: str) -> None:
    result = await handlers.import_wsdl(ImportWsdl("billing", url=f"{soap_url}/{path}?wsdl"), bridge)
    assert result.catalog.port.soap_version == path[-2] + "." + path[-1]
    assert {t.name for t in result.catalog.tools} == {"billing.get_customer", "billing.find_customers",
                                                       "billing.create_invoice", "billing.slow_echo", "billing.ping"}
    customer = (await call(bridge, "billing.get_customer", customer_id=2))["get_customerResult"]
    assert customer["balance"] == "-0.01" and customer["created"] == "2023-12-24T18:00:00+00:00"
    assert customer["address"] == {"street": "1 Difference Rd", "city": "London", "zip": None, "country": None}
    assert customer["referrer"]["name"] == "Ada Lovelace"  # nested, recursive type
    invoice = (await call(bridge, "create_invoice", customer_id=1, due="2025-01-31", lines={"InvoiceLine": [
        {"sku": "a", "quantity": 2, "unit_price": "1.10"}, {"sku": "b", "quantity": 1, "unit_price": 0.3}]}))
    assert invoice["create_invoiceResult"]["total"] == "2.50" and invoice["create_invoiceResult"]["due"] == "2025-01-31"


async def test_a_declared_fault_comes_back_structured_with_code_and_detail(bridge: Bridge, soap_url: str) -> None:
    await handlers.import_wsdl(ImportWsdl("billing", url=f"{soap_url}/soap11?wsdl"), bridge)
    with pytest.raises(BackendFault) as err:
        await call(bridge, "get_customer", customer_id=9)
    assert not err.value.retryable and "no customer 9" in err.value.reason
    assert err.value.fault["code"].endswith("Client.CustomerNotFound")
    assert err.value.fault["declared"] == "CustomerNotFound" and err.value.fault["detail"] == {"customer_id": "9"}


async def test_arguments_are_validated_against_the_generated_schema_before_any_call(bridge: Bridge,
                                                                                      soap_url: str) -> None:
    await handlers.import_wsdl(ImportWsdl("billing", url=f"{soap_url}/soap11?wsdl"), bridge)
    with pytest.raises(ValidationFailed) as err:
        await call(bridge, "find_customers", status="gone")
    assert err.value.field == "status" and "active" in err.value.hint
    with pytest.raises(ValidationFailed) as err:
        await call(bridge, "create_invoice", customer_id=1, lines={"InvoiceLine": [{"sku": "a", "quantity": 0,
                                                                                   "unit_price": "1"}]})
    assert err.value.field == "lines.InvoiceLine.0.quantity"


async def test_a_slow_operation_times_out_per_operation_policy(bridge: Bridge, soap_url: str) -> None:
    options = ImportOptions(operations={"slow_echo": OperationPolicy(timeout_seconds=0.3)})
    result = await handlers.import_wsdl(ImportWsdl("billing", url=f"{soap_url}/soap11?wsdl", options=options), bridge)
    specs = {s.name: s for s in tool_specs(result.catalog, 30.0, 0)}  # what the gateway is told
    assert specs["billing.slow_echo"].timeout_seconds == 0.3 and specs["billing.ping"].timeout_seconds == 30.0
    with pytest.raises(DeadlineExceeded) as err:
        await call(bridge, "slow_echo", text="hi", delay_ms=3000)
    assert err.value.retryable and "0.3 s" in err.value.reason
    assert await call(bridge, "slow_echo", text="hi", delay_ms=0) == {"slow_echoResult": "hi"}


@pytest.mark.parametrize(("path", "credentials"), [("basic11", "clerk_basic"), ("wsse11", "clerk_digest"),
                                                    ("wsse11", "clerk_text")])
async def test_configured_credentials_authenticate_and_missing_ones_are_refused(
        bridge: Bridge, soap_url: str, path: str, credentials: str) -> None:
    wsdl = f"{soap_url}/soap11?wsdl"
    await handlers.import_wsdl(ImportWsdl("secure", url=wsdl, options=ImportOptions(
        address=f"{soap_url}/{path}", credentials=credentials)), bridge)
    assert await call(bridge, "ping", backend="secure") == {"pingResult": "pong"}
    await handlers.import_wsdl(ImportWsdl("anon", url=wsdl, options=ImportOptions(address=f"{soap_url}/{path}")),
                               bridge)
    with pytest.raises((Unauthenticated, BackendFault)) as err:
        await call(bridge, "ping", backend="anon")
    assert not err.value.retryable


async def test_malformed_responses_and_http_errors_are_structured(bridge: Bridge, soap_url: str) -> None:
    wsdl = f"{soap_url}/soap11?wsdl"
    await handlers.import_wsdl(ImportWsdl("broken", url=wsdl, options=ImportOptions(address=f"{soap_url}/broken11")),
                               bridge)
    with pytest.raises(BadResponse) as err:
        await call(bridge, "ping", backend="broken")
    assert "not XML" in err.value.reason
    await handlers.import_wsdl(ImportWsdl("down", url=wsdl, options=ImportOptions(
        address=f"{soap_url}/down11", retries=1)), bridge)
    with pytest.raises(Unavailable) as err:
        await call(bridge, "ping", backend="down")
    assert err.value.retryable and "503" in err.value.reason


async def test_an_unreachable_wsdl_url_is_unavailable_naming_it(bridge: Bridge) -> None:
    url = f"http://127.0.0.1:{free_port()}/nothing?wsdl"
    with pytest.raises(Unavailable) as err:
        await handlers.import_wsdl(ImportWsdl("gone", url=url), bridge)
    assert "cannot be fetched" in err.value.reason


async def test_an_import_is_stored_and_reloaded_offline_by_another_process(
        bridge: Bridge, soap_url: str, db: Database, tmp_path) -> None:
    first = await handlers.import_wsdl(ImportWsdl("billing", url=f"{soap_url}/soap11?wsdl"), bridge)
    again = await handlers.import_wsdl(ImportWsdl("billing", url=f"{soap_url}/soap11?wsdl"), bridge)
    assert again.catalog.revision == first.catalog.revision == 1  # same WSDL, same version
    http = SoapHttp()
    try:
        other = Bridge(PostgresBackendStore(db), SoapLoader(http, credentials={}, wsdl_dir=tmp_path, concurrency=2),
                       RecordingRegistry())
        assert await handlers.restore(other) == []
        assert other.live["billing"].catalog.wsdl_hash == first.catalog.wsdl_hash
        assert await call(other, "ping") == {"pingResult": "pong"}
        assert await handlers.register_all(other) == []
        assert {n for n, _ in other.registry.registered} == {t.name for t in first.catalog.tools}
    finally:
        await http.aclose()
    tools, error = await handlers.drop(DropBackend("billing"), bridge)
    assert sorted(tools) == sorted(t.name for t in first.catalog.tools) and error == ""
    assert await bridge.store.get("billing") is None


async def test_grpc_invoke_answers_results_and_tool_errors_with_the_fault(bridge: Bridge, soap_url: str) -> None:
    port = free_port()
    server = GrpcServer("127.0.0.1", port, [grpc_api.registration(bridge, [])], None)
    await server.start()
    try:
        async with channel(f"127.0.0.1:{port}") as ch:
            stub = tools_pb2_grpc.AdapterStub(ch)
            imported = await stub.ImportWsdl(tools_pb2.ImportWsdlRequest(backend_id="billing",
                                                                         url=f"{soap_url}/soap12?wsdl"), timeout=30)
            assert imported.registered and imported.backend.port.soap_version == "1.2"
            spec = next(t for t in imported.backend.tools if t.name == "billing.get_customer")
            assert json_format.MessageToDict(spec.input_schema)["required"] == ["customer_id"]
            reply = await stub.Invoke(tools_pb2.InvokeRequest(backend_id="billing", operation="billing.ping"),
                                      timeout=10)
            assert json_format.MessageToDict(reply.result) == {"pingResult": "pong"} and reply.latency_ms > 0
            request = tools_pb2.InvokeRequest(backend_id="billing", operation="get_customer")
            request.arguments.update({"customer_id": 9})
            failed = await stub.Invoke(request, timeout=10)
            assert failed.error.error_type == "backend_fault" and not failed.error.retryable
            assert json_format.MessageToDict(failed.fault)["detail"] == {"customer_id": "9"}
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Invoke(tools_pb2.InvokeRequest(backend_id="nope", operation="x"), timeout=10)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            listed = await stub.ListBackends(tools_pb2.ListBackendsRequest(), timeout=10)
            assert [b.backend_id for b in listed.backends] == ["billing"]
    finally:
        await server.stop(0)


async def test_calls_run_concurrently_up_to_the_endpoint_limit(bridge: Bridge, soap_url: str) -> None:
    await handlers.import_wsdl(ImportWsdl("billing", url=f"{soap_url}/soap11?wsdl"), bridge)
    calls = [call(bridge, "slow_echo", text=str(i), delay_ms=1000) for i in range(8)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    results = await asyncio.gather(*calls)
    elapsed = loop.time() - start
    assert [r["slow_echoResult"] for r in results] == [str(i) for i in range(8)]
    # Limit 4: two waves of 1 s — not all eight at once (1 s), not in a row (8 s) nor two at a time (4 s); the
    # second of slack absorbs a loaded machine's overhead.
    assert 1.9 < elapsed < 4.0, elapsed
    json.dumps(results)


async def test_imports_and_calls_never_block_the_event_loop(bridge: Bridge, soap_url: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A heartbeat on the loop keeps beating while a WSDL is parsed (zeep, made slower here, in a
    worker thread) and while slow calls wait on the endpoint (a blocked loop would let no beat fall
    inside either), and the endpoint never sees more calls than its limit (4)."""
    from services.adapter.adapters import soap_backend

    parsing: list[float] = []
    real_load = soap_backend.load_wsdl

    def slow_load(*args, **kwargs):
        parsing.append(time.monotonic())
        time.sleep(0.1)  # a large WSDL: parsing takes a while, and must not hold the loop meanwhile
        loaded = real_load(*args, **kwargs)
        parsing.append(time.monotonic())
        return loaded

    monkeypatch.setattr(soap_backend, "load_wsdl", slow_load)
    loop = asyncio.get_running_loop()
    beats: list[float] = []
    done = asyncio.Event()

    async def heartbeat() -> None:
        while not done.is_set():
            await asyncio.sleep(0.005)
            beats.append(loop.time())

    beating = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.02)
    start = loop.time()
    await handlers.import_wsdl(ImportWsdl("billing", url=f"{soap_url}/soap11?wsdl"), bridge)
    imported = loop.time()
    limit = bridge.live["billing"].endpoint._limit
    in_flight = []

    async def observed(i: int) -> dict:
        task = asyncio.ensure_future(call(bridge, "slow_echo", text=str(i), delay_ms=200))
        while not task.done():
            in_flight.append(4 - limit._value)  # calls holding the endpoint's semaphore right now
            await asyncio.sleep(0.02)
        return task.result()

    await asyncio.gather(*(observed(i) for i in range(10)))
    called = loop.time()
    done.set()
    await beating
    assert max(in_flight) == 4  # the limit is reached and never exceeded
    assert start < parsing[0] < parsing[1] < imported  # loop.time() is time.monotonic()
    assert any(parsing[0] < t < parsing[1] for t in beats), "no heartbeat while the WSDL was parsed"
    assert sum(imported < t < called for t in beats) >= 10, "the loop stalled while calls were in flight"
