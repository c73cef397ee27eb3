"""COM failures (HRESULT, source, description) as structured errors. No I/O here, no COM.

pywin32 raises `com_error(hresult, text, excepinfo, argerr)`; excepinfo is `(wcode, source,
description, helpfile, helpcontext, scode)`. When the HRESULT is DISP_E_EXCEPTION the object
raised its own error and excepinfo's scode (or wcode) says which. `argerr` indexes IDispatch's
rgvarg, which holds the arguments in reverse order.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.adapter.domain.errors import BackendFault

__all__ = ["HRESULTS", "ComFault", "com_error_parts", "from_com_error", "hresult_name"]

_CONFIG_HINT = "operators: check the method allow-list and the ProgID against the object's type library"


@dataclass(frozen=True)
class _Rule:
    name: str
    error_type: str
    retryable: bool
    on_argument: bool  # the fault points at one argument (argerr)
    hint: str


HRESULTS: dict[int, _Rule] = {
    0x80020003: _Rule("DISP_E_MEMBERNOTFOUND", "not_found", False, False,
                      "the object has no such method or property; " + _CONFIG_HINT),
    0x80020006: _Rule("DISP_E_UNKNOWNNAME", "not_found", False, False,
                      "the object does not know this name; " + _CONFIG_HINT),
    0x80020005: _Rule("DISP_E_TYPEMISMATCH", "validation", False, True,
                      "give the argument in the type the method expects (see the tool's input schema)"),
    0x8002000A: _Rule("DISP_E_OVERFLOW", "validation", False, True,
                      "the value does not fit the type the method expects: use a smaller value"),
    0x80020004: _Rule("DISP_E_PARAMNOTFOUND", "validation", False, True, "give this argument"),
    0x8002000E: _Rule("DISP_E_BADPARAMCOUNT", "validation", False, False,
                      "the method takes another number of arguments; " + _CONFIG_HINT),
    0x80020008: _Rule("DISP_E_BADVARTYPE", "validation", False, True,
                      "this argument's type is not accepted; " + _CONFIG_HINT),
    0x80020007: _Rule("DISP_E_NONAMEDARGS", "validation", False, False, _CONFIG_HINT),
    0x8002000B: _Rule("DISP_E_BADINDEX", "validation", False, True, "the index is out of range"),
    0x80070057: _Rule("E_INVALIDARG", "validation", False, False,
                      "the object refused the arguments: correct them using the description"),
    0x80070005: _Rule("E_ACCESSDENIED", "permission_denied", False, False,
                      "the adapter's Windows account lacks the right: operators check DCOM launch and access "
                      "permissions (dcomcnfg) for this ProgID"),
    0x80040154: _Rule("REGDB_E_CLASSNOTREG", "not_found", False, False,
                      "the COM server is not registered on the adapter's host: install or register it"),
    0x800401F3: _Rule("CO_E_CLASSSTRING", "not_found", False, False, "the ProgID is not known on the adapter's host"),
    0x80004001: _Rule("E_NOTIMPL", "unimplemented", False, False, "the object does not implement this"),
    0x80004002: _Rule("E_NOINTERFACE", "unimplemented", False, False,
                      "the object does not support late-bound (IDispatch) calls"),
    0x80010105: _Rule("RPC_E_SERVERFAULT", "unavailable", True, False,
                      "the COM server crashed while handling the call; the object is created anew on the next "
                      "call: retry once it is back, and report it if it repeats"),
    0x80010108: _Rule("RPC_E_DISCONNECTED", "unavailable", True, False,
                      "the object disconnected (its server exited); it is created anew on the next call: retry"),
    0x800706BA: _Rule("RPC_S_SERVER_UNAVAILABLE", "unavailable", True, False, "the COM server is down: retry later"),
    0x800706BE: _Rule("RPC_S_CALL_FAILED", "unavailable", True, False, "the call to the COM server failed: retry"),
    0x80010001: _Rule("RPC_E_CALL_REJECTED", "unavailable", True, False,
                      "the COM server is busy (e.g. a modal dialog is open): retry later"),
    0x8001010A: _Rule("RPC_E_SERVERCALL_RETRYLATER", "unavailable", True, False, "the COM server is busy: retry later"),
    0x80080005: _Rule("CO_E_SERVER_EXEC_FAILURE", "unavailable", True, False,
                      "the COM server failed to start: retry later; operators check its log"),
    0x8007000E: _Rule("E_OUTOFMEMORY", "unavailable", True, False, "the COM server ran out of memory: retry later"),
    0x8001010E: _Rule("RPC_E_WRONG_THREAD", "internal", False, False,
                      "an adapter bug: the object was called outside its apartment; report it"),
    0x80004005: _Rule("E_FAIL", "backend_fault", False, False,
                      "the object failed without saying why: read the description and source"),
    0x8000FFFF: _Rule("E_UNEXPECTED", "backend_fault", False, False,
                      "the object failed unexpectedly: read the description and source"),
}
DISP_E_EXCEPTION = 0x80020009


class ComFault(BackendFault):
    """A COM failure with its own error type (validation, not_found, unavailable, ...), keeping the
    HRESULT, source and description in `fault`, so it answers in-band like a SOAP fault."""

    def __init__(self, reason: str, *, error_type: str, fault: dict, field: str = "", hint: str = "",
                 retryable: bool = False) -> None:
        super().__init__(reason, fault=fault, field=field, hint=hint, retryable=retryable)
        self.error_type = error_type


def hresult_name(hresult: int) -> str:
    code = hresult & 0xFFFFFFFF
    rule = HRESULTS.get(code)
    if rule:
        return rule.name
    if code == DISP_E_EXCEPTION:
        return "DISP_E_EXCEPTION"
    if code >> 16 == 0x8007:  # FACILITY_WIN32: the low word is a Win32 error code
        return f"WIN32_ERROR_{code & 0xFFFF}"
    return f"0x{code:08X}"


def com_error_parts(args: tuple) -> dict:
    """pywintypes.com_error's args `(hresult, text, excepinfo, argerr)` -> from_com_error's keywords."""
    hresult, text, excepinfo, argerr = (tuple(args) + (None, None, None, None))[:4]
    wcode, source, description, help_file, _, scode = (tuple(excepinfo or ()) + (0, "", "", "", 0, 0))[:6]
    return {"hresult": int(hresult or 0), "text": str(text or ""), "source": str(source or ""),
            "description": str(description or ""), "scode": int(scode or 0), "wcode": int(wcode or 0),
            "argerr": argerr if isinstance(argerr, int) and not isinstance(argerr, bool) else None,
            "help_file": str(help_file or "")}


def from_com_error(hresult: int, *, method: str, text: str = "", source: str = "", description: str = "",
                   scode: int = 0, wcode: int = 0, argerr: int | None = None,
                   parameters: tuple[str, ...] = (), help_file: str = "") -> ComFault:
    """A COM failure as a structured error.

    `parameters` are the names of the arguments the call passed, in order, so that `argerr` (an
    index into the reversed rgvarg) names the argument at fault.
    """
    outer = hresult & 0xFFFFFFFF
    # DISP_E_EXCEPTION wraps the object's own error: classify by that one when it is a known code.
    inner = (scode or 0) & 0xFFFFFFFF
    code = inner if outer == DISP_E_EXCEPTION and inner else outer
    rule = HRESULTS.get(code)
    field = ""
    if argerr is not None and 0 <= argerr < len(parameters):
        field = f"arguments.{parameters[len(parameters) - 1 - argerr]}"
    elif rule is not None and rule.error_type == "validation":
        field = "arguments"
    name = hresult_name(code)
    said = description or text or "(no description)"
    fault = {"hresult": f"0x{outer:08X}", "name": hresult_name(outer), "cause": name, "scode": f"0x{inner:08X}" if inner else "",
             "wcode": wcode or 0, "source": source or "", "description": description or "", "text": text or "",
             "argerr": argerr if argerr is not None else -1, "help_file": help_file or ""}
    where = f" (source {source})" if source else ""
    reason = f"COM {name} calling {method}{where}: {said}"
    if rule is not None:
        return ComFault(reason, error_type=rule.error_type, fault=fault, field=field, hint=rule.hint,
                        retryable=rule.retryable)
    if outer == DISP_E_EXCEPTION:
        hint = "the object raised an error of its own: correct the call using the description, or ask its owners"
    else:
        hint = f"unknown HRESULT {name}: look it up in the COM server's documentation"
    return ComFault(reason, error_type="backend_fault", fault=fault, field=field, hint=hint, retryable=False)
