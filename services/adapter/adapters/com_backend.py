"""COM objects behind the adapter's port: one apartment-threaded worker per object, any host.

The COM runtime itself is a port (`ComRuntime`): `com_win32.Win32Runtime` (pywin32, Windows only)
in production, a fake in the tests, so the worker, the argument conversion, the allow-list, the
timeouts and the error mapping run (and are tested) on Linux too.

Why a thread per object: an apartment-threaded (STA) object must be created and called on one
thread that pumps Windows messages; calls to it are serialised there, and the event loop only
awaits a future.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from libs.errors import DeadlineExceeded, DomainError, Internal, NotFound, ValidationFailed
from libs.logs import get_logger
from services.adapter.domain.catalog import OperationTool
from services.adapter.domain.com_config import ComMethod, ComObject, com_catalog
from services.adapter.domain.com_errors import ComFault, from_com_error
from services.adapter.domain.com_variant import VT, Variant, VariantError, from_json, to_json
from services.adapter.domain.errors import BadResponse

__all__ = ["ComBackend", "ComRuntime", "ComWorker", "com_arguments", "com_backends"]

log = get_logger(__name__)
DISP_E_PARAMNOTFOUND = 0x80020004  # the VT_ERROR value that means "argument omitted"
# Failures after which the object is gone or broken: the worker creates it anew for the next call.
_RECREATE = frozenset({"RPC_E_SERVERFAULT", "RPC_E_DISCONNECTED", "RPC_S_SERVER_UNAVAILABLE", "RPC_S_CALL_FAILED",
                       "CO_E_SERVER_EXEC_FAILURE"})


class ComRuntime(Protocol):
    """What the worker needs of COM. Every method runs on the worker's own thread."""

    com_error: type[BaseException]

    def enter_apartment(self) -> None: ...  # CoInitializeEx(COINIT_APARTMENTTHREADED)

    def leave_apartment(self) -> None: ...

    def create(self, progid: str) -> Any: ...  # late-bound IDispatch

    def call(self, obj: Any, method: ComMethod, args: list[Variant]) -> Any: ...

    def pump(self) -> None: ...  # dispatch waiting window messages (STA)

    def error_parts(self, exc: BaseException) -> dict: ...  # hresult, text, source, description, scode, ...


@dataclass
class _Job:
    method: ComMethod
    args: list[Variant]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    cancelled: bool = False


@dataclass
class ComWorker:
    """The one thread that owns one COM object: enters an STA, creates the object on first use,
    runs calls in order, pumps messages while idle, and leaves the apartment when stopped."""

    obj: ComObject
    runtime: ComRuntime
    pump_seconds: float = 0.05
    jobs: queue.Queue = field(default_factory=queue.Queue)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"com-{self.obj.backend_id}", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self.thread is not None:
            self.jobs.put(None)
            self.thread.join(timeout)

    async def call(self, method: ComMethod, args: list[Variant], timeout: float) -> object:
        if self.thread is None:
            self.start()
        loop = asyncio.get_running_loop()
        job = _Job(method, args, loop.create_future(), loop)
        self.jobs.put(job)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(job.future)
        except TimeoutError:
            job.cancelled = True  # not started yet: skipped; already running: COM cannot interrupt it
            raise DeadlineExceeded(f"{self.obj.progid}.{method.name} did not answer within {timeout:g} s",
                                   hint="retry later; if it keeps timing out, operators raise timeout_seconds "
                                        "or check the COM server") from None

    def _run(self) -> None:
        self.runtime.enter_apartment()
        instance = None
        try:
            while True:
                try:
                    job = self.jobs.get(timeout=self.pump_seconds)
                except queue.Empty:
                    self.runtime.pump()
                    continue
                if job is None:
                    return
                if job.cancelled:
                    continue
                outcome, error = None, None
                try:
                    if instance is None:
                        instance = self.runtime.create(self.obj.progid)
                    outcome = to_json(self.runtime.call(instance, job.method, job.args))
                except VariantError as exc:
                    error = BadResponse(f"{self.obj.progid}.{job.method.name} returned {exc.reason}",
                                        field=exc.field, hint=exc.hint)
                except self.runtime.com_error as exc:
                    error = from_com_error(method=f"{self.obj.progid}.{job.method.name}",
                                           parameters=tuple(p.name for p in job.method.params[:len(job.args)]),
                                           **self.runtime.error_parts(exc))
                    if error.fault["cause"] in _RECREATE:
                        instance = None
                except Exception as exc:
                    log.exception("COM call failed unexpectedly", backend=self.obj.backend_id, method=job.method.name)
                    error = Internal(f"{self.obj.progid}.{job.method.name} failed in the adapter: "
                                     f"{exc.__class__.__name__}", hint="operators: see the adapter's log")
                self._deliver(job, outcome, error)
        finally:
            instance = None  # released inside the apartment, before it is left
            self.runtime.leave_apartment()

    @staticmethod
    def _deliver(job: _Job, outcome: object, error: DomainError | None) -> None:
        def settle() -> None:
            if job.future.done():
                return
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(outcome)

        if not job.loop.is_closed():
            job.loop.call_soon_threadsafe(settle)


def com_arguments(method: ComMethod, arguments: dict) -> list[Variant]:
    """Named JSON arguments -> positional Variants by the allow-list; omitted optional ones in the
    middle are passed as "missing" (VT_ERROR DISP_E_PARAMNOTFOUND), trailing ones not at all."""
    unknown = sorted(set(arguments) - {p.name for p in method.params})
    if unknown:
        raise ValidationFailed(f"{method.name} takes no argument {unknown[0]!r}", field=f"arguments.{unknown[0]}",
                               hint=f"its arguments: {', '.join(p.name for p in method.params) or 'none'}")
    args: list[Variant] = []
    for p in method.params:
        if p.name in arguments:
            args.append(from_json(arguments[p.name], p.vt, f"arguments.{p.name}"))
        elif p.optional:
            args.append(Variant(VT["VT_ERROR"], DISP_E_PARAMNOTFOUND))
        else:
            raise ValidationFailed("is required", field=f"arguments.{p.name}")
    while args and args[-1].vt == VT["VT_ERROR"] and args[-1].value == DISP_E_PARAMNOTFOUND:
        args.pop()
    return args


class ComBackend:
    """A configured COM object as a LiveBackend: its catalog, and calls through its worker."""

    def __init__(self, obj: ComObject, runtime: ComRuntime, *, backoff_seconds: float = 0.2) -> None:
        self.obj, self.catalog, self.documents = obj, com_catalog(obj), {}
        self.worker = ComWorker(obj, runtime)
        self.backoff_seconds = backoff_seconds

    async def invoke(self, tool: OperationTool, arguments: dict) -> dict:
        method = self.obj.methods.get(tool.operation)
        if method is None:  # the catalog comes from the allow-list, so this is a mismatch, not a caller's typo
            raise NotFound(f"{tool.operation} is not on the allow-list of {self.obj.backend_id}", field="operation")
        args = com_arguments(method, arguments)
        timeout, retries = self.obj.policy(method)
        for attempt in range(retries + 1):
            try:
                return {"result": await self.worker.call(method, args, timeout)}
            except ComFault as exc:  # a timed-out call may still hold the apartment: not retried
                if not exc.retryable or attempt == retries:
                    raise
                await asyncio.sleep(self.backoff_seconds * 2 ** attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        """Stop the worker (it releases the object and leaves the apartment on its own thread)."""
        await asyncio.to_thread(self.worker.stop)


def com_backends(objects: list[ComObject], runtime: ComRuntime) -> dict[str, ComBackend]:
    return {o.backend_id: ComBackend(o, runtime) for o in objects}
