"""COM backends on Linux: the apartment worker, the allow-list and argument conversion, with a fake COM
runtime standing where pywin32 stands on Windows (services/adapter/adapters/com_win32.py)."""

from __future__ import annotations

import threading

import anyio
import pytest

from libs.errors import DeadlineExceeded, NotFound, ValidationFailed
from services.adapter.adapters.com_backend import ComBackend, com_arguments
from services.adapter.domain.com_config import com_catalog, parse_com_objects
from services.adapter.domain.com_errors import ComFault, com_error_parts
from services.adapter.domain.com_variant import VT, Variant
from services.adapter.adapters.gateway import tool_specs
from services.adapter.domain.commands import DropBackend, InvokeOperation
from services.adapter.domain.errors import BadResponse
from services.adapter.service_layer import handlers
from services.adapter.service_layer.handlers import Bridge

CONFIG = """{"ledger": {"progid": "Acme.Ledger", "timeout_seconds": 0.5, "retries": 1, "methods": {
  "Post": {"description": "Posts an amount to an account.", "returns": "VT_I4",
           "params": [{"name": "account", "vt": "VT_BSTR"}, {"name": "amount", "vt": "VT_CY"},
                      {"name": "memo", "vt": "VT_BSTR", "optional": true},
                      {"name": "on", "vt": "VT_DATE", "optional": true}]},
  "Balance": {"params": [{"name": "account", "vt": "VT_BSTR"}], "returns": "VT_CY"},
  "Wait": {"params": [{"name": "tag", "vt": "VT_BSTR"}], "timeout_seconds": 0.3},
  "Crash": {}, "Handle": {},
  "Version": {"property": true, "returns": "VT_BSTR"}}}}"""


class FakeComError(Exception):
    """Shaped like pywintypes.com_error: (hresult, text, excepinfo, argerr)."""


class FakeLedger:
    def __init__(self, runtime: FakeRuntime) -> None:
        self.runtime = runtime
        self.Version = "3.1"

    def Post(self, account, amount, memo=None, on=None):
        return 7

    def Balance(self, account):
        if account == "none":
            raise FakeComError(-2147352567, "Exception occurred.", (0, "Acme.Ledger", "No such account", None, 0,
                                                                     -2147024809), None)
        return self.runtime.balance

    def Wait(self, tag):
        self.runtime.started.set()
        self.runtime.release.wait(10)
        return tag

    def Crash(self):
        raise FakeComError(-2147417851, "The server threw an exception.", None, None)  # RPC_E_SERVERFAULT

    def Handle(self):
        return object()  # an object reference: no JSON for it


class FakeRuntime:
    com_error = FakeComError

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.calls: list[tuple[str, list[Variant]]] = []
        self.balance = __import__("decimal").Decimal("12.5000")
        self.started, self.release = threading.Event(), threading.Event()

    def _log(self, what: str) -> None:
        self.events.append((what, threading.get_ident()))

    def enter_apartment(self) -> None:
        self._log("enter")

    def leave_apartment(self) -> None:
        self._log("leave")

    def create(self, progid: str):
        assert progid == "Acme.Ledger"
        self._log("create")
        return FakeLedger(self)

    def call(self, obj, method, args):
        self._log("call")
        self.calls.append((method.name, args))
        if method.is_property:
            return getattr(obj, method.name)
        return getattr(obj, method.name)(*(a.value for a in args))

    def pump(self) -> None:
        pass

    def error_parts(self, exc: BaseException) -> dict:
        return com_error_parts(exc.args)


@pytest.fixture
async def ledger():
    runtime = FakeRuntime()
    [obj] = parse_com_objects(CONFIG)
    backend = ComBackend(obj, runtime, backoff_seconds=0)
    yield backend, runtime
    runtime.release.set()
    await backend.aclose()


async def invoke(backend: ComBackend, operation: str, **arguments):
    return await backend.invoke(backend.catalog.tool(operation), arguments)


async def test_calls_run_on_one_apartment_thread_that_creates_the_object_once_and_leaves_at_close(ledger) -> None:
    backend, runtime = ledger
    assert await invoke(backend, "Post", account="A-1", amount="10.25") == {"result": 7}
    assert await invoke(backend, "ledger.balance", account="A-1") == {"result": "12.5000"}
    assert await invoke(backend, "Version") == {"result": "3.1"}
    await backend.aclose()
    kinds = [k for k, _ in runtime.events]
    assert kinds == ["enter", "create", "call", "call", "call", "leave"]
    threads = {t for _, t in runtime.events}
    assert len(threads) == 1 and threading.get_ident() not in threads


async def test_arguments_are_converted_by_the_allow_list_and_omitted_optionals_are_marked_missing(ledger) -> None:
    backend, runtime = ledger
    await invoke(backend, "Post", account="A-1", amount=3, on="2024-03-01T09:00:00")
    _, args = runtime.calls[-1]
    assert [a.vt for a in args] == [VT["VT_BSTR"], VT["VT_CY"], VT["VT_ERROR"], VT["VT_DATE"]]
    assert args[2].value == 0x80020004  # DISP_E_PARAMNOTFOUND: "not given" for a middle optional
    await invoke(backend, "Post", account="A-1", amount=3)
    assert len(runtime.calls[-1][1]) == 2  # trailing optionals are simply not passed


def test_only_allow_listed_methods_become_tools_with_schemas_from_their_declared_types() -> None:
    catalog = com_catalog(parse_com_objects(CONFIG)[0])
    assert catalog.kind == "com" and catalog.location == "com:Acme.Ledger"
    assert [t.name for t in catalog.tools] == ["ledger.post", "ledger.balance", "ledger.wait", "ledger.crash",
                                               "ledger.handle", "ledger.version"]
    post = catalog.tool("Post")
    assert post.input_schema["required"] == ["account", "amount"] and not post.input_schema["additionalProperties"]
    assert post.description.startswith("Posts an amount") and post.output_schema["properties"]["result"] == \
        {"type": "integer"}


async def test_unknown_or_missing_arguments_are_refused_before_the_object_is_called(ledger) -> None:
    backend, runtime = ledger
    with pytest.raises(ValidationFailed) as err:
        await invoke(backend, "Post", account="A-1", amount="1", colour="red")
    assert err.value.field == "arguments.colour"
    with pytest.raises(ValidationFailed) as err:
        await invoke(backend, "Post", account="A-1")
    assert err.value.field == "arguments.amount"
    with pytest.raises(ValidationFailed) as err:
        com_arguments(backend.obj.methods["Post"], {"account": "A-1", "amount": "1.00001"})
    assert err.value.field == "arguments.amount"
    assert runtime.calls == []


async def test_a_com_error_comes_back_structured_and_a_crashed_server_is_created_anew(ledger) -> None:
    backend, runtime = ledger
    with pytest.raises(ComFault) as err:
        await invoke(backend, "Balance", account="none")
    assert (err.value.error_type, err.value.fault["cause"]) == ("validation", "E_INVALIDARG")
    assert "No such account" in err.value.reason and err.value.fault["source"] == "Acme.Ledger"
    with pytest.raises(ComFault) as err:
        await invoke(backend, "Crash")
    assert err.value.error_type == "unavailable" and err.value.retryable
    assert [n for n, _ in runtime.calls].count("Crash") == 2  # retries: 1 in the configuration
    assert await invoke(backend, "Version") == {"result": "3.1"}
    assert [k for k, _ in runtime.events].count("create") == 3  # after each crash the object is created anew


async def test_a_result_json_cannot_carry_is_a_bad_response_naming_it(ledger) -> None:
    backend, _ = ledger
    with pytest.raises(BadResponse) as err:
        await invoke(backend, "Handle")
    assert "object reference" in err.value.reason and err.value.field == "result"


async def test_a_call_that_outlives_its_timeout_is_deadline_exceeded_and_queued_ones_are_skipped(ledger) -> None:
    backend, runtime = ledger
    with anyio.fail_after(10):
        with pytest.raises(DeadlineExceeded) as err:
            await invoke(backend, "Wait", tag="first")
        assert runtime.started.is_set() and "0.3 s" in err.value.reason  # the method's own timeout
        with pytest.raises(DeadlineExceeded):
            await invoke(backend, "Wait", tag="second")  # queued behind the first, given up
        runtime.release.set()
        assert await invoke(backend, "Version") == {"result": "3.1"}
    assert [a[0].value for n, a in runtime.calls if n == "Wait"] == ["first"]


async def test_invoke_through_the_handlers_reaches_a_com_backend_like_a_soap_one(ledger) -> None:
    backend, _ = ledger
    bridge = Bridge(store=None, loader=None, registry=None, live={"ledger": backend})  # type: ignore[arg-type]
    assert await handlers.invoke(InvokeOperation("ledger", "ledger.post", {"account": "A", "amount": "1"}),
                                 bridge) == {"result": 7}
    with pytest.raises(NotFound) as err:
        await handlers.invoke(InvokeOperation("ledger", "Delete", {}), bridge)
    assert err.value.field == "operation"


@pytest.mark.parametrize(("text", "words"), [
    ('{"x": {"progid": "A.B"}}', "methods allow-list"),
    ('{"x": {"methods": {"M": {}}}}', "needs a progid"),
    ('{"x": {"progid": "A.B", "methods": {"M": {"params": [{"name": "a", "vt": "VT_FOO"}]}}}}',
     "not an automation type"),
    ('{"x": {"progid": "A.B", "methods": {"M": {"params": [{"name": "a", "optional": true}, {"name": "b"}]}}}}',
     "required after an optional"),
    ('{"Bad Id": {"progid": "A.B", "methods": {"M": {}}}}', "lower-case"),
    ("[1]", "JSON object"),
])
def test_a_bad_com_configuration_is_refused_naming_the_entry(text: str, words: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_com_objects(text)
    assert words in err.value.reason


def test_com_cannot_load_on_this_host_and_says_why() -> None:
    from libs.errors import Unimplemented
    from services.adapter.adapters.com_win32 import load_runtime

    with pytest.raises(Unimplemented) as err:
        load_runtime()
    assert "Windows host" in err.value.reason


def test_com_tools_are_registered_with_each_method_s_timeout_and_retries_else_the_object_s() -> None:
    specs = {s.name: s for s in tool_specs(com_catalog(parse_com_objects(CONFIG)[0]), 30.0, 0)}
    assert (specs["ledger.wait"].timeout_seconds, specs["ledger.wait"].retries) == (0.3, 1)
    assert (specs["ledger.post"].timeout_seconds, specs["ledger.post"].retries) == (0.5, 1)


class _NoStore:
    async def get(self, backend_id):
        return None

    async def delete(self, backend_id):
        return False


class _Registry:
    def __init__(self) -> None:
        self.removed: list[str] = []

    async def unregister(self, names):
        self.removed += names
        return ""


async def test_dropping_a_com_backend_stops_its_worker_and_removes_its_tools(ledger) -> None:
    backend, runtime = ledger
    registry = _Registry()
    bridge = Bridge(store=_NoStore(), loader=None, registry=registry, live={"ledger": backend})  # type: ignore[arg-type]
    assert await invoke(backend, "Version") == {"result": "3.1"}
    assert backend.worker.thread.is_alive()
    with anyio.fail_after(10):
        names, problem = await handlers.drop(DropBackend("ledger"), bridge)
    assert not backend.worker.thread.is_alive() and [k for k, _ in runtime.events][-1] == "leave"
    assert problem == "" and registry.removed == names and "ledger.version" in names and "ledger" not in bridge.live


def test_a_method_timeout_out_of_range_is_refused_naming_the_method() -> None:
    bad = CONFIG.replace('"timeout_seconds": 0.3', '"timeout_seconds": 900')
    with pytest.raises(ValidationFailed) as err:
        parse_com_objects(bad)
    assert "ledger.methods.Wait" in err.value.field and "timeout_seconds" in err.value.reason
