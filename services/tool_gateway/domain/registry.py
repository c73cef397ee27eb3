"""Tool specs and the rules a registration must pass. No I/O here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from jsonschema.exceptions import SchemaError

from libs.errors import ValidationFailed
from libs.safe_schema import SafeValidator, UnsupportedPattern, check_schema

__all__ = ["ToolSpec", "current_versions", "input_validator", "pick_version", "validate_arguments", "validate_spec"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict
    output_schema: dict = field(default_factory=dict)
    version: str = "1.0.0"
    scopes: tuple[str, ...] = ()
    timeout_seconds: float = 10.0
    retries: int = 0
    fallback: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    examples: tuple[dict, ...] = ()
    backend: str = ""
    # The tool that tells this one's operation's real state, asked (same arguments) when a call times out,
    # before any retry: a tool whose calls must not run twice names one.
    status_tool: str = ""


def _check_schema(schema: dict, field_name: str) -> None:
    try:
        check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        if isinstance(exc.cause, UnsupportedPattern):
            raise ValidationFailed(f"has an unsupported pattern at {where or '(root)'}: {exc.cause}",
                                   field=f"{field_name}/{where}" if where else field_name,
                                   hint="rewrite the pattern without lookarounds or backreferences (patterns "
                                        "are matched with RE2, in linear time)") from None
        raise ValidationFailed(f"is not a valid JSON Schema: {exc.message}" + (f" (at {where})" if where else ""),
                               field=field_name, hint="fix the schema; see json-schema.org draft 2020-12") from None
    if schema.get("type", "object") != "object":
        raise ValidationFailed("must describe an object (type: object)", field=field_name,
                               hint="tool arguments and results are JSON objects")


def validate_spec(spec: ToolSpec) -> ToolSpec:
    """Refuse a spec that is incomplete, or whose examples do not validate against its own schema."""
    if not _NAME.match(spec.name):
        raise ValidationFailed("must be lower_snake_case words separated by dots, e.g. crm.get_customer",
                               field="name")
    if not _VERSION.match(spec.version or ""):
        raise ValidationFailed("must be MAJOR.MINOR.PATCH, e.g. 1.2.0", field="version")
    if len(spec.description.strip()) < 10:
        raise ValidationFailed("must say in a sentence what the tool does (10 characters at least)",
                               field="description", hint="agents choose tools by their descriptions")
    if not 0 < spec.timeout_seconds <= 600:
        raise ValidationFailed("must be between 0 and 600 seconds", field="timeout_seconds")
    if not 0 <= spec.retries <= 5:
        raise ValidationFailed("must be between 0 and 5", field="retries")
    # That the status tool is registered is checked at registration (service_layer/handlers.register_tool).
    if spec.status_tool and (spec.status_tool == spec.name or not _NAME.match(spec.status_tool)):
        raise ValidationFailed("must name another registered tool, e.g. payments.get_transfer",
                               field="status_tool", hint="the tool that answers whether the operation happened")
    _check_schema(spec.input_schema, "input_schema")
    if spec.output_schema:
        _check_schema(spec.output_schema, "output_schema")
    validator = SafeValidator(spec.input_schema)
    for i, example in enumerate(spec.examples):
        errors = sorted(validator.iter_errors(example.get("arguments", example)), key=lambda e: list(e.path))
        if errors:
            err = errors[0]
            where = "/".join(str(p) for p in err.path) or "(root)"
            raise ValidationFailed(f"does not validate against input_schema at {where}: {err.message}",
                                   field=f"examples[{i}]", hint="fix the example or the schema")
    return spec


# Compiled validators by (name, version), each with the schema it was built from: building one costs
# far more than the check itself, and a spec read again from the registry is a new object with an
# equal schema. A federated tool keeps its name and version when its upstream changes the schema,
# hence the comparison (identity first, then equality) rather than trusting the key alone.
_VALIDATORS: dict[tuple[str, str], tuple[dict, SafeValidator]] = {}
_MAX_VALIDATORS = 4_096


def input_validator(spec: ToolSpec) -> SafeValidator:
    """The compiled validator of `spec`'s input schema, built once per tool version and schema."""
    key = (spec.name, spec.version)
    cached = _VALIDATORS.get(key)
    if cached is not None and (cached[0] is spec.input_schema or cached[0] == spec.input_schema):
        return cached[1]
    if len(_VALIDATORS) >= _MAX_VALIDATORS:
        _VALIDATORS.clear()  # a registry that large churns; rebuilding on demand is correct, only slower
    validator = SafeValidator(spec.input_schema)
    _VALIDATORS[key] = (spec.input_schema, validator)
    return validator


def validate_arguments(spec: ToolSpec, arguments: dict) -> dict:
    """Refuse call arguments that do not validate against the tool's input schema, naming the first path."""
    errors = sorted(input_validator(spec).iter_errors(arguments), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.path)
        raise ValidationFailed(err.message, field=f"arguments/{where}" if where else "arguments",
                               hint=f"see the input schema of {spec.name} (tools/list)")
    return arguments


def output_error(spec: ToolSpec, result: dict) -> str:
    """Why `result` does not validate against `spec`'s output schema ("" when it does, or there is none)."""
    if not spec.output_schema:
        return ""
    errors = sorted(SafeValidator(spec.output_schema).iter_errors(result), key=lambda e: list(e.path))
    if not errors:
        return ""
    where = "/".join(str(p) for p in errors[0].path) or "(root)"
    return f"{where}: {errors[0].message}"[:300]


def _version_key(spec: ToolSpec) -> tuple[int, ...]:
    return tuple(int(part) for part in spec.version.split("."))


def current_versions(specs: list[ToolSpec], pins: dict[str, str] | None = None) -> list[ToolSpec]:
    """One spec per name, the pinned (stable) version or else the highest, in name order.

    Agents see a tool by its name alone (MCP names are unique), so they get the current version;
    the others stay registered for callers that name a version, for canaries and for rollback.
    """
    current: dict[str, ToolSpec] = {}
    pins = pins or {}
    for spec in specs:
        held = current.get(spec.name)
        if held is None or (held.version != pins.get(spec.name)
                            and (spec.version == pins.get(spec.name) or _version_key(spec) > _version_key(held))):
            current[spec.name] = spec
    return [current[name] for name in sorted(current)]


def pick_version(specs: list[ToolSpec], version: str = "") -> ToolSpec | None:
    """`version` when named, else the highest; None when there is no such version."""
    if version:
        return next((s for s in specs if s.version == version), None)
    return max(specs, key=_version_key, default=None)
