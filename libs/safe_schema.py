"""JSON Schema (draft 2020-12) validation whose regular expressions run in linear time.

jsonschema matches `pattern`, `patternProperties` (and, through them, `additionalProperties`
and `unevaluatedProperties`) with Python's backtracking `re`: `^(a+)+$` against 27 a's and a
"!" takes seconds, every extra character doubles it, and nothing can interrupt it. Here those
keywords match with RE2, which guarantees time linear in the input and has no lookarounds and
no backreferences; a schema using them is refused by `check_schema` (the `regex` format of the
metaschema is checked with RE2 too), naming where the pattern is.

JSON Schema patterns are ECMA-262 regular expressions; RE2 accepts the common subset (classes,
quantifiers, anchors, groups, `\\d \\w \\s`, `\\p{L}`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import re2
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema.exceptions import SchemaError, best_match

__all__ = ["SafeValidator", "UnsupportedPattern", "check_schema", "compile_pattern"]

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would print every refused pattern to stderr


class UnsupportedPattern(ValueError):
    """A pattern RE2 cannot compile: a lookaround, a backreference, or a syntax error."""


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> re2._Regexp:
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise UnsupportedPattern(f"{pattern!r} cannot be matched in linear time (RE2: {reason}); lookaheads, "
                                 "lookbehinds and backreferences are not supported") from None


def _search(pattern: str, text: str) -> bool:
    return compile_pattern(pattern).search(text) is not None


def _pattern(validator, pattern: str, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{_short(instance)} does not match {pattern!r}")


def _pattern_properties(validator, patterns: dict, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: dict, schema: dict) -> list[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [key for key in instance
            if key not in properties and not any(_search(p, key) for p in patterns)]


def _additional_properties(validator, allowed: Any, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        yield ValidationError(f"additional properties are not allowed ({', '.join(map(repr, sorted(extras)))} "
                              "unexpected)")


def _valid(errors: Iterator[ValidationError]) -> bool:
    return next(errors, None) is None


def _evaluated_keys(validator, instance: dict, schema: Any) -> set[str]:
    """The keys of `instance` some keyword of `schema` evaluates (jsonschema's own walk, with RE2)."""
    if validator.is_type(schema, "boolean"):
        return set()
    keys: set[str] = set()
    for ref_keyword in ("$ref", "$dynamicRef"):
        if (ref := schema.get(ref_keyword)) is not None:
            resolved = validator._resolver.lookup(ref)
            keys |= _evaluated_keys(validator.evolve(schema=resolved.contents, _resolver=resolved.resolver),
                                    instance, resolved.contents)
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (subschema := schema.get(keyword)) is not None:
            keys |= {key for key, value in instance.items() if _valid(validator.descend(value, subschema))}
    for pattern in schema.get("patternProperties", {}):
        keys |= {key for key in instance if _search(pattern, key)}
    for key, subschema in schema.get("dependentSchemas", {}).items():
        if key in instance:
            keys |= _evaluated_keys(validator, instance, subschema)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if _valid(validator.descend(instance, subschema)):
                keys |= _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"])
    return keys


def _unevaluated_properties(validator, unevaluated: Any, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    bad = [key for key in instance if key not in evaluated
           and not _valid(validator.descend(instance[key], unevaluated, path=key, schema_path=key))]
    if bad:
        yield ValidationError(f"unevaluated properties are not allowed ({', '.join(map(repr, sorted(bad)))} "
                              "unexpected)")


def _short(value: str, limit: int = 40) -> str:
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} characters)"


_FORMATS = FormatChecker()
_FORMATS.checks("regex", raises=UnsupportedPattern)(lambda text: not isinstance(text, str)
                                                    or compile_pattern(text) is not None)

SafeValidator = validators.extend(
    Draft202012Validator,
    {"pattern": _pattern, "patternProperties": _pattern_properties,
     "additionalProperties": _additional_properties, "unevaluatedProperties": _unevaluated_properties},
)
"""Draft 2020-12 with every regular expression matched by RE2. Use it on schemas `check_schema` accepted."""


def check_schema(schema: Any) -> None:
    """Raise SchemaError when `schema` is not valid draft 2020-12 or holds a pattern RE2 cannot match.

    A refused pattern comes back as a SchemaError whose `path` leads to it and whose `cause` is
    the UnsupportedPattern saying why.
    """
    validator = Draft202012Validator(Draft202012Validator.META_SCHEMA, format_checker=_FORMATS)
    errors = list(validator.iter_errors(schema))
    for error in errors:
        if isinstance(error.cause, UnsupportedPattern):
            raise SchemaError.create_from(error) from error.cause
    if errors:
        raise SchemaError.create_from(best_match(errors))
