"""COM on Linux: VARIANT <-> JSON and COM errors -> structured errors, pure functions (no pywin32)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.errors import ValidationFailed
from services.adapter.domain.com_errors import com_error_parts, from_com_error
from services.adapter.domain.com_variant import (
    VT,
    VT_ARRAY,
    Variant,
    VariantError,
    datetime_to_ole,
    from_json,
    ole_to_datetime,
    to_json,
    vt_of,
    vt_schema,
)
from services.tool_gateway.domain.registry import ToolSpec, validate_arguments

INTS = {"VT_I1": (-128, 127), "VT_UI1": (0, 255), "VT_I2": (-2**15, 2**15 - 1), "VT_UI2": (0, 2**16 - 1),
        "VT_I4": (-2**31, 2**31 - 1), "VT_UI4": (0, 2**32 - 1), "VT_INT": (-2**31, 2**31 - 1),
        "VT_UINT": (0, 2**32 - 1), "VT_I8": (-2**63, 2**63 - 1), "VT_UI8": (0, 2**64 - 1)}
# Automation dates span 0100-01-01 .. 9999-12-31; a double keeps them to the millisecond.
DATES = st.datetimes(min_value=dt.datetime(100, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))
SCALARS = st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=20) | \
    st.floats(allow_nan=False, allow_infinity=False)


@given(st.sampled_from(sorted(INTS)).flatmap(lambda name: st.tuples(st.just(name), st.integers(*INTS[name]))))
def test_every_integer_type_round_trips_and_big_ones_leave_as_exact_strings(case: tuple[str, int]) -> None:
    name, value = case
    out = to_json(from_json(value, vt_of(name)))
    assert out == value if abs(value) <= 2**53 else out == str(value)


@given(DATES)
def test_ole_automation_dates_round_trip_to_the_millisecond(when: dt.datetime) -> None:
    assert ole_to_datetime(datetime_to_ole(when)) == when
    assert to_json(Variant(VT["VT_DATE"], datetime_to_ole(when))) == to_json(from_json(when.isoformat(), 7).value)


def test_ole_dates_count_from_1899_12_30_and_the_fraction_runs_forward_before_it() -> None:
    assert ole_to_datetime(0) == dt.datetime(1899, 12, 30)
    assert ole_to_datetime(2.5) == dt.datetime(1900, 1, 1, 12)
    assert ole_to_datetime(-1.25) == dt.datetime(1899, 12, 29, 6)
    assert ole_to_datetime(45000) == dt.datetime(2023, 3, 15)
    assert datetime_to_ole(dt.datetime(1899, 12, 29, 6)) == -1.25
    assert to_json(Variant(VT["VT_DATE"], 45000.75)) == "2023-03-15T18:00:00"


@given(st.decimals(min_value=Decimal("-922337203685477.5808"), max_value=Decimal("922337203685477.5807"),
                   places=4, allow_nan=False))
def test_currency_keeps_its_four_decimals_as_a_string(amount: Decimal) -> None:
    out = to_json(from_json(str(amount), VT["VT_CY"]))
    assert isinstance(out, str) and Decimal(out) == amount


@given(st.decimals(allow_nan=False, allow_infinity=False, places=6, min_value=-10**20, max_value=10**20))
def test_decimals_round_trip_exactly_as_strings(number: Decimal) -> None:
    assert Decimal(to_json(from_json(str(number), VT["VT_DECIMAL"]))) == number


@given(st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4), max_leaves=12))
def test_untyped_values_and_nested_arrays_round_trip_through_variants(value: object) -> None:
    assert to_json(from_json(value, VT["VT_VARIANT"])) == value


def test_results_as_pywin32_gives_them_become_plain_json() -> None:
    utc_labelled = dt.datetime(2024, 3, 1, 14, 30, tzinfo=dt.UTC)  # pywin32 labels COM dates UTC
    assert to_json((1, "x", None, True, Decimal("1.50"), utc_labelled, b"\x00\xff")) == \
        [1, "x", None, True, "1.50", "2024-03-01T14:30:00", "AP8="]
    assert to_json(((1, 2), (3, 4))) == [[1, 2], [3, 4]]  # a 2-D SAFEARRAY
    assert to_json(Variant(VT["VT_CY"], 123456)) == "12.3456"  # raw currency: 1/10000 units
    assert to_json(Variant(VT["VT_BOOL"], -1)) is True  # VARIANT_TRUE
    assert to_json(Variant(VT["VT_EMPTY"])) is None and to_json(Variant(VT["VT_NULL"])) is None
    assert to_json(Variant(VT_ARRAY | VT["VT_R8"], ((1.5, 2.0), (3.0, 4.5)))) == [[1.5, 2.0], [3.0, 4.5]]
    assert to_json(Variant(VT_ARRAY | VT["VT_UI1"], b"hi")) == "aGk="
    assert to_json(Variant(VT["VT_VARIANT"], Variant(VT["VT_I8"], 2**60))) == str(2**60)  # nested variant
    assert to_json(Variant(VT["VT_ERROR"], -2147352572)) == {"scode": "0x80020004"}


def test_what_json_cannot_carry_is_refused_naming_its_path() -> None:
    with pytest.raises(VariantError) as err:
        to_json((1, object()))
    assert err.value.field == "result.1" and "object reference" in err.value.reason
    with pytest.raises(VariantError) as err:
        to_json(Variant(VT_ARRAY | VT["VT_VARIANT"], (Variant(VT["VT_DISPATCH"], "x"),)))
    assert err.value.field == "result.0" and "VT_DISPATCH" in err.value.reason
    with pytest.raises(VariantError) as err:
        to_json(float("nan"))
    assert "no JSON form" in err.value.reason


@pytest.mark.parametrize(("value", "vt", "field", "words"), [
    (128, "VT_I1", "arguments", "outside VT_I1"),
    (True, "VT_I4", "arguments", "must be an integer"),
    ("12.34567", "VT_CY", "arguments", "4 decimals"),
    ("1" * 30, "VT_DECIMAL", "arguments", "does not fit VT_DECIMAL"),
    ("2024-03-01T10:00:00+02:00", "VT_DATE", "arguments", "time zone"),
    ("yesterday", "VT_DATE", "arguments", "not an ISO 8601 date"),
    (1e39, "VT_R4", "arguments", "outside VT_R4"),
    ([1, "x"], "VT_ARRAY|VT_I4", "arguments.1", "must be an integer"),
    ({"a": 1}, "VT_VARIANT", "arguments", "no automation equivalent"),
    (None, "VT_BSTR", "arguments", "must not be null"),
])
def test_arguments_that_do_not_fit_their_declared_type_name_field_and_reason(value, vt, field, words) -> None:
    with pytest.raises(ValidationFailed) as err:
        from_json(value, vt_of(vt))
    assert err.value.field == field and words in err.value.reason


@pytest.mark.parametrize(("vt", "good", "bad"), [
    ("VT_UI1", 255, 256), ("VT_I8", "-9223372036854775808", "12x"), ("VT_CY", "10.5", "ten"),
    ("VT_BSTR[]", ["a"], [1]), ("VT_BOOL", False, 0),
])
def test_the_generated_schema_accepts_what_the_conversion_accepts(vt: str, good, bad) -> None:
    spec = ToolSpec("t.x", "A test tool here.", {"type": "object", "properties": {"v": vt_schema(vt_of(vt))}})
    validate_arguments(spec, {"v": good})
    from_json(good, vt_of(vt))
    with pytest.raises(ValidationFailed):
        validate_arguments(spec, {"v": bad})


@pytest.mark.parametrize(("hresult", "error_type", "retryable"), [
    (0x80020003, "not_found", False),  # DISP_E_MEMBERNOTFOUND
    (0x80020005, "validation", False),  # DISP_E_TYPEMISMATCH
    (0x80010105, "unavailable", True),  # RPC_E_SERVERFAULT
    (0x80070005, "permission_denied", False),  # E_ACCESSDENIED
    (0x80010001, "unavailable", True),  # RPC_E_CALL_REJECTED
    (0x80040154, "not_found", False),  # REGDB_E_CLASSNOTREG
    (0x80004001, "unimplemented", False),  # E_NOTIMPL
    (0x80041234, "backend_fault", False),  # unknown
])
def test_known_hresults_map_to_error_types_an_agent_can_act_on(hresult, error_type, retryable) -> None:
    signed = hresult - 2**32  # pywin32 gives HRESULTs as signed ints
    error = from_com_error(signed, method="Calc.Add", source="Calc", description="it broke")
    assert (error.error_type, error.retryable) == (error_type, retryable)
    assert error.fault["hresult"] == f"0x{hresult:08X}" and error.hint
    assert error.to_dict()["error_type"] == error_type and "it broke" in error.reason


def test_an_exception_raised_by_the_object_keeps_source_description_and_names_the_argument() -> None:
    # What pywin32 raises for DISP_E_EXCEPTION wrapping a type mismatch on the 2nd of 3 arguments:
    # argerr counts from the end (IDispatch's rgvarg is reversed).
    args = (-2147352567, "Exception occurred.", (0, "Acme.Ledger", "Amount is not a number", None, 0, -2147352571),
            1)
    error = from_com_error(method="Acme.Ledger.Post", parameters=("account", "amount", "memo"),
                           **com_error_parts(args))
    assert (error.error_type, error.field) == ("validation", "arguments.amount")
    assert error.fault["name"] == "DISP_E_EXCEPTION" and error.fault["cause"] == "DISP_E_TYPEMISMATCH"
    assert error.fault["source"] == "Acme.Ledger" and "Amount is not a number" in error.reason
    own = from_com_error(method="Acme.Ledger.Post", **com_error_parts(
        (-2147352567, "Exception occurred.", (1001, "Acme.Ledger", "Period is closed", "ledger.chm", 0, 0), None)))
    assert own.error_type == "backend_fault" and not own.retryable and own.fault["wcode"] == 1001
    assert "Period is closed" in own.reason and own.fault["help_file"] == "ledger.chm"
