"""Structured queries over the retriever's PostgreSQL projection (`documents`), and the router's vocabulary.

Each validated condition becomes one SQL predicate with bound parameters (names never reach the SQL text:
an attribute path is a text[] parameter). Attribute equality uses JSONB containment (the GIN index on
`attributes`); comparisons read the attribute only when its JSON type is the value's, so "500" (a string)
never compares with 500 (a number) and nothing raises a cast error.
"""

from __future__ import annotations

from libs.db import Database
from services.retriever.adapters.postgres import COLUMNS, document_of_row
from services.retriever.domain import Document
from services.retriever.domain.router import Vocabulary
from services.retriever.domain.structured import Condition, StructuredQuery

__all__ = ["PostgresQueries", "compile_query"]

_SQL_OPS = {"eq": "=", "ne": "<>", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_COLUMN_TYPES = {"text": "text", "uuid": "uuid", "integer": "int", "time": "timestamptz"}
# A keyed memory's content that parses as a JSON number (the entity value 5000, -3.5, 1e3).
_NUMERIC = r"^\s*-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?\s*$"
_VOCABULARY_VALUE_CHARS = 64
_VOCABULARY_ROWS = 2_000


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class _Builder:
    def __init__(self) -> None:
        self.params: list[object] = []

    def p(self, value: object, cast: str = "") -> str:
        self.params.append(value)
        return f"${len(self.params)}{'::' + cast if cast else ''}"

    def condition(self, c: Condition) -> str:
        if c.path:
            return self._json(c, c.path)
        if c.field == "value":
            return self._value(c)
        column, kind = f"d.{c.field}", c.kind
        if c.field == "memory_id":
            column = "d.memory_id"
        if kind == "tags":
            values = c.value if c.op == "in" else [c.value]
            return f"d.tags && {self.p(values, 'text[]')}"
        if c.op == "exists":
            return f"{column} IS {'NOT ' if c.value else ''}NULL"
        cast = _COLUMN_TYPES[kind]
        if c.op == "in":
            return f"{column} = ANY({self.p(c.value, cast + '[]')})"
        if c.op == "prefix":
            return f"{column} LIKE {self.p(_like(c.value) + '%')}"
        if c.op == "contains":
            return f"{column} ILIKE {self.p('%' + _like(c.value) + '%')}"
        return f"{column} {_SQL_OPS[c.op]} {self.p(c.value, cast)}"

    def _json(self, c: Condition, path: tuple[str, ...]) -> str:
        if c.op == "eq":  # containment alone: the GIN index answers it
            return f"d.attributes @> {self._nested(path, c.value)}"
        at = f"(d.attributes #> {self.p(list(path), 'text[]')})"
        if c.op == "exists":
            return f"{at} IS {'NOT ' if c.value else ''}NULL"
        if c.op == "in":
            return f"{at} = ANY({self.p(list(c.value), 'jsonb[]')})"
        if c.op == "ne":
            return f"({at} IS NOT NULL AND NOT d.attributes @> {self._nested(path, c.value)})"
        if c.op in ("prefix", "contains"):
            pattern = _like(c.value) + "%" if c.op == "prefix" else "%" + _like(c.value) + "%"
            like = "LIKE" if c.op == "prefix" else "ILIKE"
            return f"(jsonb_typeof({at}) = 'string' AND {at} #>> '{{}}' {like} {self.p(pattern)})"
        if isinstance(c.value, str):
            return (f"(CASE WHEN jsonb_typeof({at}) = 'string' THEN {at} #>> '{{}}' END)"
                    f" {_SQL_OPS[c.op]} {self.p(c.value)}")
        return (f"(CASE WHEN jsonb_typeof({at}) = 'number' THEN ({at})::numeric END)"
                f" {_SQL_OPS[c.op]} {self.p(c.value, 'numeric')}")

    def _nested(self, path: tuple[str, ...], value: object) -> str:
        for name in reversed(path):
            value = {name: value}
        return self.p(value, "jsonb")  # the pool's codec encodes it

    def _value(self, c: Condition) -> str:
        """The entity value of a keyed memory: its content, a number when it parses as one."""
        keyed = "d.key <> ''"
        if c.op == "exists":
            return keyed if c.value else f"NOT ({keyed})"
        numeric = isinstance(c.value, (int, float)) and not isinstance(c.value, bool) or (
            c.op == "in" and isinstance(c.value[0], (int, float)) and not isinstance(c.value[0], bool))
        if numeric:
            number = f"(CASE WHEN d.content ~ {self.p(_NUMERIC)} THEN d.content::numeric END)"
            if c.op == "in":
                return f"({keyed} AND {number} = ANY({self.p(c.value, 'numeric[]')}))"
            return f"({keyed} AND {number} {_SQL_OPS[c.op]} {self.p(c.value, 'numeric')})"
        if isinstance(c.value, bool) or (c.op == "in" and isinstance(c.value[0], bool)):
            values = c.value if c.op == "in" else [c.value]
            test = f"lower(btrim(d.content)) = ANY({self.p([str(v).lower() for v in values], 'text[]')})"
            return f"({keyed} AND {'NOT ' if c.op == 'ne' else ''}{test})"
        return f"({keyed} AND {self.condition(Condition('content', c.op, c.value))})"


def compile_query(q: StructuredQuery) -> tuple[str, list[object]]:
    """SQL and parameters for a validated query: limit + 1 rows, so the caller knows whether it was cut."""
    b = _Builder()
    where = [f"d.tenant_id = {b.p(q.tenant_id)}"]
    if q.user_id:
        where.append(f"d.user_id = {b.p(q.user_id)}")
    if q.session_id:
        where.append(f"d.session_id = {b.p(q.session_id)}")
    if not q.include_archived:
        where.append("NOT d.archived")
    where.append("(d.expires_at IS NULL OR d.expires_at > now())")
    where += [b.condition(c) for c in q.conditions]
    direction = "ASC" if q.ascending else "DESC"
    if q.order_path:
        order = f"d.attributes #> {b.p(list(q.order_path), 'text[]')} {direction} NULLS LAST"
    elif q.order_by == "value":
        order = f"d.content {direction}"
    else:
        order = f"d.{q.order_by} {direction} NULLS LAST"
    sql = (f"SELECT {COLUMNS} FROM documents d WHERE {' AND '.join(where)}"
           f" ORDER BY {order}, d.created_at DESC, d.memory_id LIMIT {b.p(q.limit + 1, 'int')}")
    return sql, b.params


class PostgresQueries:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def query(self, q: StructuredQuery) -> tuple[list[Document], bool]:
        """The memories matching every condition, in order; and whether more matched than `limit`."""
        sql, params = compile_query(q)
        async with self.db.transaction(q.tenant_id) as conn:  # row-level security confines it to the tenant too
            rows = await conn.fetch(sql, *params)
        return [document_of_row(r) for r in rows[: q.limit]], len(rows) > q.limit

    async def vocabulary(self, tenant_id: str, user_id: str = "") -> Vocabulary:
        """The entity keys, attribute names (top level and one level down) and short text values of the
        tenant's (or user's) current memories: what the router may recognise in a request."""
        owner, params = ("AND user_id = $2", [tenant_id, user_id]) if user_id else ("", [tenant_id])
        async with self.db.transaction(tenant_id) as conn:
            keys = await conn.fetch(f"SELECT DISTINCT key FROM documents WHERE tenant_id = $1 {owner}"
                                    f" AND key <> '' AND NOT archived LIMIT {_VOCABULARY_ROWS}", *params)
            pairs = await conn.fetch(
                f"SELECT DISTINCT a.path, CASE WHEN jsonb_typeof(a.value) = 'string'"
                f"  AND length(a.value #>> '{{}}') <= {_VOCABULARY_VALUE_CHARS} THEN a.value #>> '{{}}' END AS value"
                f" FROM documents d, LATERAL ("
                f"  SELECT e.key AS path, e.value FROM jsonb_each(d.attributes) e"
                f"  UNION ALL SELECT e.key || '.' || f.key, f.value FROM jsonb_each(d.attributes) e,"
                f"   jsonb_each(CASE WHEN jsonb_typeof(e.value) = 'object' THEN e.value ELSE '{{}}' END) f) a"
                f" WHERE d.tenant_id = $1 {owner} AND NOT d.archived LIMIT {_VOCABULARY_ROWS}", *params)
        values: dict[str, set[str]] = {}
        for r in pairs:
            values.setdefault(r["path"], set())
            if r["value"]:
                values[r["path"]].add(r["value"])
        return Vocabulary(keys=frozenset(r["key"] for r in keys), attributes=frozenset(values),
                          values={k: frozenset(v) for k, v in values.items() if v})
