"""A result kept as the JSON text it came as (gpulayer.wire: json_members, Splice, ResultJSON):
read out of a request's body with the json module's own scanner, written into an answer as
it is. The same value and the same errors as json.loads, whatever the document holds."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticSerializationError

from gpulayer.wire import ResultJSON, Splice, json_members

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)
SPACE = st.text(alphabet=" \t\n\r", max_size=3)


@st.composite
def documents(draw: st.DrawFn) -> str:
    """An object written by hand: whitespace anywhere it may go, escapes or not, repeated keys."""
    members = draw(st.lists(st.tuples(st.sampled_from(["result", "state", "r\u00e9sult", "x"]) | st.text(max_size=4),
                                      JSON, st.booleans()), max_size=5))
    parts = []
    for k, v, ascii_only in members:
        value = json.dumps(v, ensure_ascii=ascii_only, indent=draw(st.sampled_from([None, 1])))
        parts.append(f"{draw(SPACE)}{json.dumps(k, ensure_ascii=ascii_only)}{draw(SPACE)}:{draw(SPACE)}{value}{draw(SPACE)}")
    return f"{draw(SPACE)}{{{','.join(parts) or draw(SPACE)}}}{draw(SPACE)}"


@given(documents())
def test_the_value_is_json_loads_and_each_kept_text_is_its_member_as_written(doc: str) -> None:
    value, kept = json_members(doc.encode(), {"result", "r\u00e9sult"})
    assert value == json.loads(doc)
    for name, text in kept.items():
        assert json.loads(text) == value[name] is not None
        assert text in doc and text == text.strip()
    assert set(kept) == {k for k in ("result", "r\u00e9sult") if value.get(k) is not None}


def test_the_text_is_kept_byte_for_byte_and_the_last_of_a_repeated_member_wins() -> None:
    doc = '{"result": {"a" : [1,  2.50, "caf\\u00e9"]}, "state": "succeeded", "result" :  [ 1e2 ] }'
    value, kept = json_members(doc, ["result"])
    assert value == {"result": [100.0], "state": "succeeded"}
    assert kept == {"result": "[ 1e2 ]"}
    assert json_members('{"result": {"a" : [1,  2.50]}}', ["result"])[1] == {"result": '{"a" : [1,  2.50]}'}
    assert json_members('{"result": null, "x": 1}', ["result"]) == ({"result": None, "x": 1}, {})


@pytest.mark.parametrize("doc", [
    b"", b"  ", b"{", b'{"a" 1}', b'{"a": }', b'{"a": 1,}', b'{"a": 1} x', b'{"a": [1, 2}', b'{"a": "\\x"}',
    b"[1, 2]", b'"text"', b"3", b"null", b'{"a": 1}{"b": 2}', b'{1: 2}', b'{"a": 1 "b": 2}',
    '{"result": "caf\u00e9"}'.encode("utf-16"), b'\xef\xbb\xbf{"result": [1]}', b'{"result": [1]}\x00',
])
def test_anything_else_reads_as_json_loads_reads_it_with_its_error(doc: bytes) -> None:
    try:
        expected: Any = json.loads(doc)
    except ValueError as exc:
        with pytest.raises(type(exc)) as got:
            json_members(doc, ["result"])
        assert str(got.value) == str(exc)
    else:
        assert json_members(doc, ["result"])[0] == expected


@pytest.mark.parametrize("doc", ['\ufeff{"result": 1}', '{"result": 1} \ufeff', "", "{"])
def test_a_str_reads_as_json_loads_reads_it_too(doc: str) -> None:
    with pytest.raises(ValueError) as expected:
        json.loads(doc)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        json_members(doc, ["result"])


def test_the_hooks_are_json_loads_s() -> None:
    seen: list[str] = []
    value, kept = json_members(b'{"result": [1.5, 2e400], "x": 0.25}', ["result"],
                               parse_float=lambda t: seen.append(t) or float(t))
    assert seen == ["1.5", "2e400", "0.25"] and value["result"][1] == float("inf")
    assert kept == {"result": "[1.5, 2e400]"}


def test_bytes_that_are_not_utf_8_fail_as_in_json_loads() -> None:
    with pytest.raises(UnicodeDecodeError):
        json.loads(b'{"result": "\xff"}')
    with pytest.raises(UnicodeDecodeError):
        json_members(b'{"result": "\xff"}', ["result"])


def test_a_constant_that_is_not_json_is_refused_wherever_it_is() -> None:
    def refuse(name: str) -> Any:
        raise LookupError(name)

    for doc in ('{"result": [1, NaN]}', '{"x": Infinity, "result": 1}', '{"result": -Infinity}'):
        with pytest.raises(LookupError):
            json_members(doc, ["result"], parse_constant=refuse)


class Record(BaseModel):
    id: str
    result: Any = None


def test_a_splice_writes_each_text_as_it_is_in_one_encoding() -> None:
    texts = ['{"a" : [1,  2.50]}', '"\\u0000gpulayer-json-text:0"', "null", '"caf\\u00e9 \u00e9"']
    records = [Record(id=f"j{i}", result=ResultJSON(t)) for i, t in enumerate(texts)] + [Record(id="v", result=[1])]
    splice = Splice()
    encoded = splice.splice(TypeAdapter(list[Record]).dump_json(records, fallback=splice.mark))
    for i, t in enumerate(texts):
        assert f'{{"id":"j{i}","result":{t}}}'.encode() in encoded
    assert [r["result"] for r in json.loads(encoded)] == [json.loads(t) for t in texts] + [[1]]
    # a value that merely looks like a mark is left as it is: each splice's marks are its own
    plain = Record(id="p", result="\0gpulayer-json-text:0")
    other = Splice()
    assert json.loads(other.splice(TypeAdapter(Record).dump_json(plain, fallback=other.mark))) == plain.model_dump()


def test_nothing_else_is_taken_for_json_text() -> None:
    splice = Splice()
    with pytest.raises(PydanticSerializationError, match="not JSON"):
        TypeAdapter(Record).dump_json(Record(id="x", result=object()), fallback=splice.mark)
    with pytest.raises(PydanticSerializationError):  # (without a fallback: refused, not written as an object)
        TypeAdapter(Record).dump_json(Record(id="x", result=ResultJSON("1")))
    assert not splice and splice.splice(b"[1]") == b"[1]"
