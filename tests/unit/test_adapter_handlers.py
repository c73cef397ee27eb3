"""The adapter's handlers with fakes for every port (store, loader, gateway registry), and the gateway
registry's RegisterTool / RemoveTool calls against a fake stub."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import grpc
import pytest

from libs.errors import NotFound, Unavailable, ValidationFailed
from services.adapter.adapters.gateway import GatewayRegistry
from services.adapter.domain.catalog import Catalog, FailedOperation, OperationTool, PortInfo
from services.adapter.domain.commands import DropBackend, ImportOptions, ImportWsdl, InvokeOperation
from services.adapter.service_layer import handlers
from services.adapter.service_layer.handlers import Bridge
from services.adapter.service_layer.ports import StoredBackend

PORT = PortInfo("Billing", "BillingSoap", "BillingBinding", "1.1", "http://erp.invalid/billing")
SCHEMA = {"type": "object", "properties": {}}


def catalog(backend_id: str, operations: list[str], wsdl_hash: str = "a" * 64, failed=()) -> Catalog:
    tools = tuple(OperationTool(f"{backend_id}.{op.lower()}", op, f"Calls {op}.", SCHEMA, SCHEMA) for op in operations)
    return Catalog(backend_id, wsdl_hash, 1, "http://erp.invalid/billing?wsdl", PORT, (PORT,), tools,
                   tuple(FailedOperation(op, "bad type") for op in failed))


@dataclasses.dataclass
class FakeLive:
    catalog: Catalog
    documents: dict
    calls: list = dataclasses.field(default_factory=list)

    async def invoke(self, tool, arguments):
        self.calls.append((tool.operation, arguments))
        return {"ok": tool.operation}

    async def aclose(self):
        self.closed = True


class FakeLoader:
    """Serves the catalogs put in `wsdls` by WSDL text (the document an import sends)."""

    def __init__(self) -> None:
        self.wsdls: dict[bytes, Catalog] = {}
        self.loads: list[tuple[str, int, bool]] = []

    async def load(self, command: ImportWsdl, *, revision: int, trusted: bool = False) -> FakeLive:
        self.loads.append((command.backend_id, revision, trusted))
        if command.document not in self.wsdls:
            raise Unavailable(f"the WSDL of {command.backend_id} cannot be fetched", field="url")
        found = self.wsdls[command.document]
        return FakeLive(dataclasses.replace(found, backend_id=command.backend_id),
                        {"http://erp.invalid/billing?wsdl": command.document})


class FakeStore:
    def __init__(self) -> None:
        self.rows: dict[str, StoredBackend] = {}

    async def get(self, backend_id):
        return self.rows.get(backend_id)

    async def save(self, backend):
        self.rows[backend.backend_id] = backend

    async def delete(self, backend_id):
        return self.rows.pop(backend_id, None) is not None

    async def list(self):
        return [self.rows[k] for k in sorted(self.rows)]


class FakeRegistry:
    def __init__(self) -> None:
        self.registered: list[tuple[str, int]] = []
        self.removed: list[str] = []
        self.failure = ""

    async def register(self, catalog, timeout_seconds, retries):
        self.registered += [(t.name, catalog.revision) for t in catalog.tools]
        return self.failure

    async def unregister(self, names):
        self.removed += names
        return ""


@pytest.fixture
def bridge() -> Bridge:
    loader = FakeLoader()
    loader.wsdls[b"v1"] = catalog("billing", ["GetCustomer", "Ping"])
    loader.wsdls[b"v2"] = catalog("billing", ["GetCustomer"], wsdl_hash="b" * 64)
    loader.wsdls[b"empty"] = catalog("billing", [], failed=["Broken"])
    return Bridge(FakeStore(), loader, FakeRegistry())


def importing(document: bytes, backend_id: str = "billing", **options) -> ImportWsdl:
    return ImportWsdl(backend_id, document=document, base_url="http://erp.invalid/billing?wsdl",
                      options=ImportOptions(**options))


async def test_an_import_is_stored_registered_and_callable(bridge: Bridge) -> None:
    result = await handlers.import_wsdl(importing(b"v1"), bridge)
    assert result.registration_error == "" and result.catalog.revision == 1
    assert bridge.store.rows["billing"].tools == ["billing.getcustomer", "billing.ping"]
    assert bridge.registry.registered == [("billing.getcustomer", 1), ("billing.ping", 1)]
    assert await handlers.invoke(InvokeOperation("billing", "billing.ping", {}), bridge) == {"ok": "Ping"}


async def test_the_same_wsdl_keeps_its_revision_and_a_changed_one_removes_the_operations_it_lost(
        bridge: Bridge) -> None:
    await handlers.import_wsdl(importing(b"v1"), bridge)
    assert (await handlers.import_wsdl(importing(b"v1"), bridge)).catalog.revision == 1
    assert (await handlers.import_wsdl(importing(b"v1", timeout_seconds=5), bridge)).catalog.revision == 2
    changed = await handlers.import_wsdl(importing(b"v2"), bridge)
    assert changed.catalog.revision == 3 and bridge.registry.removed == ["billing.ping"]


async def test_a_wsdl_with_no_operation_that_maps_is_refused_naming_the_failures(bridge: Bridge) -> None:
    with pytest.raises(ValidationFailed) as err:
        await handlers.import_wsdl(importing(b"empty"), bridge)
    assert "Broken: bad type" in err.value.reason and bridge.store.rows == {}


async def test_a_gateway_that_refuses_the_tools_leaves_the_import_standing_and_says_why(bridge: Bridge) -> None:
    bridge.registry.failure = "billing.ping: the gateway is unreachable"
    result = await handlers.import_wsdl(importing(b"v1"), bridge)
    assert result.registration_error == "billing.ping: the gateway is unreachable"
    assert "billing" in bridge.store.rows and "billing" in bridge.live


async def test_a_backend_imported_by_another_replica_is_loaded_from_the_store_on_first_call(bridge: Bridge) -> None:
    await handlers.import_wsdl(importing(b"v1"), bridge)
    await handlers.import_wsdl(importing(b"v1", timeout_seconds=5), bridge)  # revision 2
    other = Bridge(bridge.store, bridge.loader, FakeRegistry())
    assert await handlers.invoke(InvokeOperation("billing", "GetCustomer", {"id": 1}), other) == {"ok": "GetCustomer"}
    assert bridge.loader.loads[-1] == ("billing", 2, True)  # trusted: the stored documents, no folder check
    assert other.live["billing"].catalog.revision == 2


async def test_unknown_backends_and_operations_are_not_found_with_what_exists(bridge: Bridge) -> None:
    await handlers.import_wsdl(importing(b"v1"), bridge)
    with pytest.raises(NotFound) as err:
        await handlers.invoke(InvokeOperation("erp", "Ping", {}), bridge)
    assert err.value.field == "backend_id" and "billing" in err.value.reason
    with pytest.raises(NotFound) as err:
        await handlers.invoke(InvokeOperation("billing", "Delete", {}), bridge)
    assert err.value.field == "operation" and "GetCustomer" in err.value.hint


async def test_drop_forgets_the_backend_and_removes_its_tools_from_the_gateway(bridge: Bridge) -> None:
    await handlers.import_wsdl(importing(b"v1"), bridge)
    live = bridge.live["billing"]
    tools, error = await handlers.drop(DropBackend("billing"), bridge)
    assert tools == ["billing.getcustomer", "billing.ping"] and error == "" and live.closed
    assert bridge.registry.removed == tools and bridge.store.rows == {} and bridge.live == {}
    with pytest.raises(NotFound):
        await handlers.drop(DropBackend("billing"), bridge)


async def test_restore_loads_what_it_can_and_names_what_it_cannot(bridge: Bridge) -> None:
    await handlers.import_wsdl(importing(b"v1"), bridge)
    await handlers.import_wsdl(importing(b"v2", backend_id="crm"), bridge)
    del bridge.loader.wsdls[b"v2"]  # its documents no longer load
    fresh = Bridge(bridge.store, bridge.loader, FakeRegistry())
    problems = await handlers.restore(fresh)
    assert list(fresh.live) == ["billing"] and len(problems) == 1 and problems[0].startswith("crm: ")
    fresh.registry.failure = "down"
    assert await handlers.register_all(fresh) == ["billing: down"]


# --- the gateway registry against a fake ToolGateway stub ---------------------------------------

def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class FakeGatewayStub:
    """Stands for tools_pb2_grpc.ToolGatewayStub: records requests, fails the names in `fail`."""

    requests: list = []
    fail: dict[str, grpc.StatusCode] = {}

    def __init__(self, channel) -> None:
        pass

    async def RegisterTool(self, request, timeout):
        self.requests.append(("register", request.tool.name, request.tool.backend, request.tool.version))
        if request.tool.name in self.fail:
            raise rpc_error(self.fail[request.tool.name], "refused")

    async def RemoveTool(self, request, timeout):
        self.requests.append(("remove", request.name))
        if request.name in self.fail:
            raise rpc_error(self.fail[request.name], "refused")


@pytest.fixture
def stub():
    FakeGatewayStub.requests, FakeGatewayStub.fail = [], {}
    return FakeGatewayStub


def registry(stub, **messages) -> GatewayRegistry:
    from libs.protogen.mnemesh.v1 import tools_pb2

    namespace = SimpleNamespace(RegisterToolRequest=tools_pb2.RegisterToolRequest, **messages)
    return GatewayRegistry("127.0.0.1:1", lambda: "token", stub=stub, messages=namespace)


async def test_tools_are_registered_as_adapter_backends_and_a_known_version_is_not_an_error(stub) -> None:
    stub.fail = {"billing.ping": grpc.StatusCode.ABORTED}  # registered already, e.g. by another replica
    assert await registry(stub).register(catalog("billing", ["GetCustomer", "Ping"]), 30.0, 0) == ""
    assert stub.requests == [("register", "billing.getcustomer", "adapter:billing/GetCustomer", "1.11184810.0"),
                             ("register", "billing.ping", "adapter:billing/Ping", "1.11184810.0")]


async def test_an_unreachable_gateway_stops_registration_at_the_first_tool(stub) -> None:
    stub.fail = {"billing.getcustomer": grpc.StatusCode.UNAVAILABLE}
    problem = await registry(stub).register(catalog("billing", ["GetCustomer", "Ping"]), 30.0, 0)
    assert problem == "billing.getcustomer: refused" and len(stub.requests) == 1


async def test_drop_removes_each_tool_with_remove_tool_and_a_missing_one_counts_as_removed(stub) -> None:
    stub.fail = {"billing.ping": grpc.StatusCode.NOT_FOUND}
    remover = registry(stub, RemoveToolRequest=lambda name: SimpleNamespace(name=name))
    assert await remover.unregister(["billing.getcustomer", "billing.ping"]) == ""
    assert stub.requests == [("remove", "billing.getcustomer"), ("remove", "billing.ping")]
    stub.requests, stub.fail = [], {"billing.a": grpc.StatusCode.PERMISSION_DENIED}
    problem = await remover.unregister(["billing.a", "billing.b", "billing.c"])
    assert problem == "billing.a: refused; 2 more not tried" and len(stub.requests) == 1


async def test_without_a_remove_rpc_in_the_gateway_drop_says_the_tools_stay_listed(stub) -> None:
    problem = await registry(stub).unregister(["billing.ping"])
    assert "no RemoveTool RPC" in problem and "billing.ping" in problem and stub.requests == []


def test_a_tool_is_found_by_tool_name_or_operation_name_the_first_in_order_winning() -> None:
    tools = (OperationTool("b.get", "Get", "", SCHEMA, SCHEMA), OperationTool("b.put", "b.get", "", SCHEMA, SCHEMA),
             OperationTool("b.get_2", "Get", "", SCHEMA, SCHEMA))
    catalog = Catalog("b", "h", 1, "http://erp.invalid/b?wsdl", PORT, (PORT,), tools)
    assert catalog.tool("b.get") is tools[0] and catalog.tool("Get") is tools[0]
    assert catalog.tool("b.put") is tools[1] and catalog.tool("b.get_2") is tools[2]
    assert catalog.tool("Put") is None
    assert dataclasses.replace(catalog, tools=tools[1:]).tool("Get") is tools[2]  # a new catalog, a new index
