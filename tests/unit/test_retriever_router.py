"""The memory router and the validation of structured queries (domain rules, no I/O)."""

from __future__ import annotations

import pytest

from libs.errors import ValidationFailed
from services.retriever.domain.router import Vocabulary, route
from services.retriever.domain.structured import Condition, StructuredQuery

VOCABULARY = Vocabulary(
    keys=frozenset({"user.budget", "user.name"}),
    attributes=frozenset({"customer", "amount", "客户", "金额", "order.total"}),
    values={"customer": frozenset({"Acme", "Globex"}), "客户": frozenset({"华为", "小米"})})


@pytest.mark.parametrize("text, conditions", [
    ("every memory of customer Acme with amount > 500",
     {("attributes.customer", "eq", "Acme"), ("attributes.amount", "gt", 500)}),
    ("memories where amount is at least 1,200.5", {("attributes.amount", "gte", 1200.5)}),
    ("memories with an order total under $80", {("attributes.order.total", "lt", 80)}),
    ("客户华为金额大于1000的记录", {("attributes.客户", "eq", "华为"), ("attributes.金额", "gt", 1000)}),
    ("金额不超过500的记忆", {("attributes.金额", "lte", 500)}),
    ("what is my user.name", {("key", "eq", "user.name")}),
    ("show 5D1F2C1E-4A53-4C1E-9A51-6AD3C3F1B2AA", {("memory_id", "eq", "5d1f2c1e-4a53-4c1e-9a51-6ad3c3f1b2aa")}),
])
def test_keys_comparisons_and_ids_go_to_the_structured_path(text: str, conditions: set) -> None:
    r = route(text, VOCABULARY)
    assert r.path == "structured" and {(c.field, c.op, c.value) for c in r.conditions} == conditions


@pytest.mark.parametrize("text", [
    "what did Acme complain about at the meeting?",  # a value without its attribute's name: no condition
    "上次和王经理讨论了什么", "the paramount over 5 stars",  # "amount" inside another word is no name
    "how much was the amount of the last order",  # a name without a comparison or a known value
])
def test_a_request_without_conditions_goes_to_the_semantic_path(text: str) -> None:
    r = route(text, VOCABULARY)
    assert r.path == "semantic" and r.conditions == () and r.rest == text


@pytest.mark.parametrize("text, rest_has", [
    ("customer Acme complained about late delivery, amount at least 300", "delivery"),
    ("金额不超过500并且提到交付延迟的客户华为记录", "交付"),
])
def test_conditions_mixed_with_content_words_go_to_both_paths(text: str, rest_has: str) -> None:
    r = route(text, VOCABULARY)
    assert r.path == "both" and len(r.conditions) == 2 and rest_has in r.rest
    assert "Acme" not in r.rest and "华为" not in r.rest


def test_a_valid_query_is_normalised() -> None:
    q = StructuredQuery("acme", (Condition(" attributes.amount ", "GT", 500.0), Condition("layer", "in", [1, 2.0]),
                                 Condition("created_at", "gte", "2025-01-01T00:00:00Z"))).validated()
    assert q.conditions[0].path == ("amount",) and q.conditions[0].op == "gt" and q.conditions[0].value == 500
    assert q.conditions[1].value == [1, 2] and q.conditions[2].value.tzinfo is not None and q.limit == 50


@pytest.mark.parametrize("condition, field, reason", [
    (Condition("colour", "eq", "red"), "where[0].field", "no field"),
    (Condition("attributes.", "eq", "x"), "where[0].field", "not an attribute path"),
    (Condition("attributes.a b", "eq", "x"), "where[0].field", "not an attribute path"),
    (Condition("tags", "eq", "x"), "where[0].op", "does not take"),
    (Condition("layer", "eq", "five"), "where[0].value", "whole number"),
    (Condition("layer", "eq", 1.5), "where[0].value", "whole number"),
    (Condition("memory_id", "eq", "42"), "where[0].value", "not a UUID"),
    (Condition("attributes.amount", "gt", True), "where[0].value", "cannot order"),
    (Condition("attributes.amount", "gt", None), "where[0].value", "missing"),
    (Condition("attributes.amount", "in", []), "where[0].value", "list of 1"),
    (Condition("attributes.amount", "in", [1, "a"]), "where[0].value", "mixes"),
    (Condition("attributes.name", "prefix", 3), "where[0].value", "must be text"),
    (Condition("created_at", "lt", "last week"), "where[0].value", "not a timestamp"),
    (Condition("attributes.x", "exists", "yes"), "where[0].value", "exists"),
])
def test_a_bad_condition_is_refused_with_its_field_reason_and_hint(condition: Condition, field: str,
                                                                   reason: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        StructuredQuery("acme", (condition,)).validated()
    assert caught.value.field == field and reason in caught.value.reason and caught.value.hint


def test_a_query_needs_a_tenant_conditions_and_a_sane_limit() -> None:
    ok = (Condition("key", "eq", "user.name"),)
    for q, field in [(StructuredQuery("", ok), "tenant.tenant_id"), (StructuredQuery("acme", ()), "where"),
                     (StructuredQuery("acme", ok * 17), "where"), (StructuredQuery("acme", ok, limit=5000), "limit"),
                     (StructuredQuery("acme", ok, order_by="tags"), "order_by")]:
        with pytest.raises(ValidationFailed) as caught:
            q.validated()
        assert caught.value.field == field
