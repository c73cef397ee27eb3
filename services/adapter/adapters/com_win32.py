"""The real ComRuntime: pywin32 late-bound dispatch. Windows only, and the only module that imports
pywin32 (lazily, so the adapter imports everywhere). Not run by the tests on Linux: see the README,
adapter section, "Tested where".
"""

from __future__ import annotations

import sys
from typing import Any

from libs.errors import Unimplemented
from services.adapter.domain.com_config import ComMethod
from services.adapter.domain.com_errors import com_error_parts
from services.adapter.domain.com_variant import VT, Variant

__all__ = ["Win32Runtime", "load_runtime"]


def load_runtime() -> Win32Runtime:
    """The pywin32 runtime, or Unimplemented saying why COM cannot run on this host."""
    if sys.platform != "win32":
        raise Unimplemented(f"COM objects need a Windows host (this one is {sys.platform})",
                            hint="run an adapter on Windows for the COM backends; this one serves SOAP only")
    try:
        import pythoncom  # noqa: F401
        import win32com.client  # noqa: F401
    except ImportError:
        raise Unimplemented("pywin32 is not installed", hint="pip install -r requirements.lock on the Windows host") \
            from None
    return Win32Runtime()


class Win32Runtime:
    def __init__(self) -> None:
        import pythoncom
        import pywintypes

        self.pythoncom = pythoncom
        self.com_error = pywintypes.com_error

    def enter_apartment(self) -> None:
        self.pythoncom.CoInitializeEx(self.pythoncom.COINIT_APARTMENTTHREADED)

    def leave_apartment(self) -> None:
        self.pythoncom.CoUninitialize()

    def create(self, progid: str) -> Any:
        from win32com.client import dynamic

        return dynamic.Dispatch(progid)  # late-bound: no makepy, no type library cache

    def _variant(self, v: Variant) -> Any:
        from win32com.client import VARIANT

        if v.vt == VT["VT_ERROR"]:
            return self.pythoncom.Missing  # an omitted optional argument
        if isinstance(v.value, tuple):  # SAFEARRAY of VARIANTs: each element typed as converted
            return VARIANT(v.vt, tuple(self._variant(e) if isinstance(e, Variant) else e for e in v.value))
        return VARIANT(v.vt, v.value)

    def call(self, obj: Any, method: ComMethod, args: list[Variant]) -> Any:
        if method.is_property:
            return getattr(obj, method.name)
        return getattr(obj, method.name)(*(self._variant(a) for a in args))

    def pump(self) -> None:
        self.pythoncom.PumpWaitingMessages()

    def error_parts(self, exc: BaseException) -> dict:
        return com_error_parts(tuple(exc.args))
