"""The adapter's backend list (MNEMESH_ADAPTER_BACKENDS)."""

from __future__ import annotations

import pytest

from libs.errors import ValidationFailed
from services.adapter.domain.backends import Backend, parse_backends


def test_a_list_of_backends_is_parsed_keeping_colons_in_locations() -> None:
    spec = "billing=soap:file:///srv/billing.wsdl, excel=com:Excel.Application,"
    assert parse_backends(spec) == [
        Backend("billing", "soap", "file:///srv/billing.wsdl"),
        Backend("excel", "com", "Excel.Application"),
    ]


@pytest.mark.parametrize("spec", ["", "  ", ",,"])
def test_no_backends_is_an_empty_list(spec: str) -> None:
    assert parse_backends(spec) == []


@pytest.mark.parametrize("entry", ["billing", "billing=soap", "=soap:x.wsdl", "billing=soap:", "billing:soap:x"])
def test_an_entry_that_is_not_id_kind_location_is_refused_quoting_it(entry: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_backends(f"ok=com:Ok.App,{entry}")
    assert err.value.field == "MNEMESH_ADAPTER_BACKENDS"
    assert repr(entry) in err.value.reason
    assert "id=kind:location" in err.value.reason


def test_an_unknown_backend_kind_is_refused_naming_the_kind_and_the_known_ones() -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_backends("crm=rest:https://crm.example/api")
    assert err.value.field == "MNEMESH_ADAPTER_BACKENDS"
    assert "'rest'" in err.value.reason and "'crm'" in err.value.reason
    assert "soap" in err.value.hint and "com" in err.value.hint


def test_two_backends_with_the_same_id_are_refused() -> None:
    with pytest.raises(ValidationFailed) as err:
        parse_backends("billing=soap:a.wsdl,billing=com:Billing.App")
    assert err.value.field == "MNEMESH_ADAPTER_BACKENDS"
    assert "unique" in err.value.reason
