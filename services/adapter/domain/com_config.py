"""COM objects as configured (ProgID + method allow-list) and the Catalog of their tools. No I/O here.

    {"calc": {"progid": "Acme.Calculator", "timeout_seconds": 10, "retries": 1,
              "methods": {"Add": {"description": "Adds two numbers.", "returns": "VT_R8", "timeout_seconds": 2,
                                  "params": [{"name": "a", "vt": "VT_R8"}, {"name": "b", "vt": "VT_R8"}]},
                          "Version": {"property": true, "returns": "VT_BSTR"}}}}

Only the listed methods (and properties, read with `"property": true`) become tools; nothing
else on the object can be reached.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from libs.errors import ValidationFailed
from services.adapter.domain.catalog import Catalog, OperationTool, PortInfo, describe_operation
from services.adapter.domain.com_variant import VT_ARRAY, vt_name, vt_of, vt_schema
from services.adapter.domain.naming import check_backend_id, tool_name

__all__ = ["ComMethod", "ComObject", "ComParam", "com_catalog", "parse_com_objects"]

_FIELD = "MNEMESH_ADAPTER_COM_FILE"


@dataclass(frozen=True)
class ComParam:
    name: str
    vt: int
    optional: bool = False


@dataclass(frozen=True)
class ComMethod:
    name: str
    params: tuple[ComParam, ...] = ()
    returns: int = 12  # VT_VARIANT
    description: str = ""
    is_property: bool = False
    timeout_seconds: float = 0.0  # 0: the object's timeout_seconds
    retries: int = -1  # -1: the object's retries


@dataclass(frozen=True)
class ComObject:
    backend_id: str
    progid: str
    methods: dict[str, ComMethod]
    timeout_seconds: float = 30.0
    retries: int = 0
    config_hash: str = ""

    def policy(self, method: ComMethod) -> tuple[float, int]:
        """(timeout in seconds, retries) of one method: its own, else the object's."""
        return (method.timeout_seconds or self.timeout_seconds,
                method.retries if method.retries >= 0 else self.retries)


def _method(backend_id: str, name: str, entry: object) -> ComMethod:
    where = f"{_FIELD}: {backend_id}.methods.{name}"
    if not isinstance(entry, dict) or not name.isidentifier():
        raise ValidationFailed("must be an object under an identifier", field=where)
    params, seen = [], set()
    for i, p in enumerate(entry.get("params") or []):
        if not isinstance(p, dict) or not isinstance(p.get("name"), str) or not p["name"].isidentifier():
            raise ValidationFailed(f"params[{i}] needs a name (an identifier)", field=where)
        if p["name"] in seen:
            raise ValidationFailed(f"params[{i}] repeats {p['name']!r}", field=where)
        seen.add(p["name"])
        optional = bool(p.get("optional", False))
        if params and params[-1].optional and not optional:
            raise ValidationFailed(f"params[{i}] is required after an optional one", field=where,
                                   hint="COM optional parameters come last")
        params.append(ComParam(p["name"], vt_of(str(p.get("vt", "VT_VARIANT"))), optional))
    is_property = bool(entry.get("property", False))
    if is_property and params:
        raise ValidationFailed("a property read takes no params", field=where)
    timeout, retries = entry.get("timeout_seconds", 0.0), entry.get("retries", -1)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 <= timeout <= 600:
        raise ValidationFailed("timeout_seconds must be between 0 and 600 (0: the object's)", field=where)
    if not isinstance(retries, int) or isinstance(retries, bool) or not -1 <= retries <= 5:
        raise ValidationFailed("retries must be between 0 and 5 (-1: the object's)", field=where)
    return ComMethod(name, tuple(params), vt_of(str(entry.get("returns", "VT_VARIANT"))),
                     str(entry.get("description", "")), is_property, float(timeout), retries)


def parse_com_objects(text: str) -> list[ComObject]:
    """The JSON of MNEMESH_ADAPTER_COM_FILE -> ComObjects; ValidationFailed naming the bad entry."""
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationFailed(f"is not JSON: {exc.msg} at {exc.pos}", field=_FIELD) from None
    if not isinstance(data, dict):
        raise ValidationFailed("must be a JSON object of backend id -> COM object", field=_FIELD)
    objects = []
    for backend_id, entry in data.items():
        check_backend_id(backend_id, field=_FIELD)
        if not isinstance(entry, dict) or not isinstance(entry.get("progid"), str) or not entry["progid"]:
            raise ValidationFailed(f"{backend_id} needs a progid, e.g. Excel.Application", field=_FIELD)
        methods = entry.get("methods")
        if not isinstance(methods, dict) or not methods:
            raise ValidationFailed(f"{backend_id} needs a methods allow-list (name -> params)", field=_FIELD,
                                   hint="only listed methods become tools")
        timeout, retries = entry.get("timeout_seconds", 30.0), entry.get("retries", 0)
        if not isinstance(timeout, (int, float)) or not 0 < timeout <= 600:
            raise ValidationFailed(f"{backend_id}.timeout_seconds must be between 0 and 600", field=_FIELD)
        if not isinstance(retries, int) or not 0 <= retries <= 5:
            raise ValidationFailed(f"{backend_id}.retries must be between 0 and 5", field=_FIELD)
        digest = hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()
        objects.append(ComObject(backend_id, entry["progid"],
                                 {name: _method(backend_id, name, m) for name, m in methods.items()},
                                 float(timeout), retries, digest))
    return objects


def _output_schema(vt: int) -> dict:
    base = vt & 0x0FFF
    if vt & VT_ARRAY:
        return {"type": "array", "items": _output_schema(base)}
    if base in (2, 3, 16, 17, 18, 19, 22, 23):
        return {"type": "integer"}
    if base in (20, 21):
        return {"type": ["integer", "string"]}
    if base in (4, 5):
        return {"type": "number"}
    if base in (6, 7, 8, 14):
        return {"type": "string"}
    if base == 11:
        return {"type": "boolean"}
    return {}


def com_catalog(obj: ComObject, revision: int = 1) -> Catalog:
    port = PortInfo(service=obj.progid, port="IDispatch", binding="late-bound", soap_version="",
                    address=f"com:{obj.progid}")
    tools, taken = [], set()
    for method in obj.methods.values():
        properties = {p.name: {**vt_schema(p.vt), "description": f"{vt_name(p.vt)}"
                               + (f"; {vt_schema(p.vt)['description']}" if "description" in vt_schema(p.vt) else "")}
                      for p in method.params}
        input_schema = {"type": "object", "properties": properties, "additionalProperties": False}
        required = [p.name for p in method.params if not p.optional]
        if required:
            input_schema["required"] = required
        output_schema = {"type": "object", "properties": {"result": _output_schema(method.returns)}}
        name = tool_name(obj.backend_id, method.name, taken)
        taken.add(name)
        documentation = method.description or (f"Reads the {method.name} property of the COM object {obj.progid}."
                                               if method.is_property else "")
        description = describe_operation(method.name, obj.progid, documentation, input_schema, ())
        timeout, retries = obj.policy(method)
        tools.append(OperationTool(name=name, operation=method.name, description=description,
                                   input_schema=input_schema, output_schema=output_schema, style="com",
                                   timeout_seconds=timeout, retries=retries))
    return Catalog(backend_id=obj.backend_id, wsdl_hash=obj.config_hash, revision=revision,
                   location=f"com:{obj.progid}", port=port, ports=(port,), tools=tuple(tools), kind="com")
