"""Structure of XSD content models for the schema generator: which members a choice offers, which may
be absent, the JSON Schema rule of a choice, and which definitions a schema references."""

from __future__ import annotations

from zeep.xsd.elements.indicators import Choice, Group, OrderIndicator

__all__ = ["choice_rule", "options", "reachable", "structure"]


def reachable(schema: dict, defs: dict[str, dict]) -> set[str]:
    """The names of `defs` that `schema` references, directly or through other definitions (one
    builder serves every operation of a port, so each schema carries only the definitions it uses)."""
    found: set[str] = set()
    pending: list[object] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref[len("#/$defs/"):]
                if name not in found and name in defs:
                    found.add(name)
                    pending.append(defs[name])
            pending.extend(value for key, value in node.items() if key != "$defs")
        elif isinstance(node, list):
            pending.extend(node)
    return found


def options(choice: Choice) -> list[list[str]]:
    """The property names of each option of a choice. Leaf members take the name zeep gives them
    (an xsd:any has none of its own: zeep calls it `_value_N`)."""
    given = {id(member): name for name, member in choice.elements}
    found = []
    for member in choice:
        if isinstance(member, (OrderIndicator, Group)):
            found.append([n for n, _ in member.elements])
        else:
            name = given.get(id(member)) or getattr(member, "attr_name", None) or getattr(member, "name", None)
            found.append([name] if name else [])
    return [o for o in found if o]


def structure(root: object) -> tuple[set[str], list[tuple[list[list[str]], bool]]]:
    """Names that may be absent (inside a choice or an optional group) and the single choices."""
    optional: set[str] = set()
    choices: list[tuple[list[list[str]], bool]] = []

    def walk(node: object, inherited_optional: bool) -> None:
        if isinstance(node, Group):
            node = node.child
        if not isinstance(node, OrderIndicator) or node.accepts_multiple:
            return
        is_optional = inherited_optional or node.min_occurs == 0
        if isinstance(node, Choice):
            choices.append((options(node), is_optional))
            optional.update(n for n, _ in node.elements)
        elif is_optional:
            optional.update(n for n, _ in node.elements)
        for child in node:
            walk(child, is_optional or isinstance(node, Choice))

    walk(root, False)
    return optional, choices


def choice_rule(options: list[list[str]], optional: bool) -> dict:
    """Exactly one option present (or none, for an optional choice)."""
    branches = [{"anyOf": [{"required": [n]} for n in names]} if len(names) > 1 else {"required": names}
                for names in options]
    if optional:
        every = [n for names in options for n in names]
        branches.append({"not": {"anyOf": [{"required": [n]} for n in every]}})
    return {"oneOf": branches}
