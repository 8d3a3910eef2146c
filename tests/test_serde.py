"""The JSON serde beyond plain JSON: datetime, date, time, UUID, Decimal, enums and attrs
classes round-trip; a default= hook; an unserialisable payload names its key path."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import pickle
import uuid
from typing import Any

import attrs
import pytest
import redis

from streamq import InvalidArgument, JsonSerde, Queue, QueueConfig, SerializationError


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1


@attrs.frozen
class Point:
    x: int
    when: dt.date


RICH: dict[str, Any] = {
    "aware": dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    "naive": dt.datetime(2024, 5, 6, 7, 8, 9),
    "day": dt.date(2024, 2, 29),
    "clock": dt.time(23, 59, 1),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "money": [decimal.Decimal("1.10"), decimal.Decimal("-0"), decimal.Decimal("1E+3")],
    "nested": {"deep": [{"at": dt.date(2020, 1, 1)}]},
}


def test_standard_types_round_trip_exactly() -> None:
    serde = JsonSerde()
    back = serde.loads(serde.dumps(RICH))
    assert back == RICH
    assert [str(d) for d in back["money"]] == ["1.10", "-0", "1E+3"]  # exponent and sign kept
    assert back["aware"].utcoffset() == dt.timedelta(hours=2) and back["naive"].tzinfo is None


def test_enums_and_attrs_classes_round_trip_when_listed() -> None:
    value = {"c": Color.BLUE, "l": Level.LOW, "p": Point(3, dt.date(2021, 1, 2))}
    listed = JsonSerde(classes=[Color, Level, Point])
    assert listed.loads(listed.dumps(value)) == value
    # a reader not given the classes gets their plain value (never code from data)
    assert JsonSerde().loads(listed.dumps(value)) == {
        "c": "blue", "l": 1, "p": {"x": 3, "when": dt.date(2021, 1, 2)}}
    with pytest.raises(InvalidArgument, match="not an enum or an attrs class"):
        JsonSerde(classes=[dict])


def test_plain_json_is_unchanged() -> None:
    assert JsonSerde().dumps({"a": [1, 2.5, "x", None, True]}) == b'{"a":[1,2.5,"x",null,true]}'


def test_default_hook_converts_other_objects() -> None:
    serde = JsonSerde(default=lambda o: sorted(o) if isinstance(o, set) else str(o))
    assert serde.loads(serde.dumps({"tags": {"b", "a"}, "n": complex(1, 2)})) == {
        "tags": ["a", "b"], "n": "(1+2j)"}
    refusing = JsonSerde(default=lambda o: (_ for _ in ()).throw(TypeError("no")))
    with pytest.raises(SerializationError):
        refusing.dumps({"s": {1}})


def test_a_serde_with_options_survives_pickling() -> None:
    serde = pickle.loads(pickle.dumps(JsonSerde(classes=[Color])))
    assert serde.loads(serde.dumps(Color.RED)) is Color.RED


def _explain(payload: Any) -> SerializationError:
    with pytest.raises(SerializationError) as exc:
        JsonSerde().dumps(payload)
    return exc.value


def test_unserialisable_values_name_their_key_path() -> None:
    err = _explain({"order": {"items": [1, {"tags": {"a"}}]}})
    assert err.path == ("order", "items", 1, "tags")
    assert "['order']['items'][1]['tags'] is a set ({'a'})" in str(err)
    assert "convert it to plain data (or pass default= to JsonSerde)" in str(err)
    assert _explain([1.0, float("nan")]).path == (1,)
    assert "NaN or an infinity" in str(_explain({"x": float("inf")}))
    assert _explain({"p": Point(1, object())}).path == ("p", "when")  # type: ignore[arg-type]


def test_the_reserved_key_is_refused() -> None:
    with pytest.raises(SerializationError, match=r"reserved .* \(at \['a'\]\)"):
        JsonSerde().dumps({"a": {"__streamq__": "datetime", "v": "2020-01-01"}})


def test_enqueue_names_the_payload_key_path(url: str, qname: str) -> None:
    q = Queue.from_url(url, qname)
    with pytest.raises(SerializationError) as exc:
        q.enqueue("t", {"user": {"id": 1, "seen": {1, 2}}})
    assert str(exc.value).startswith("not JSON-serialisable: payload['user']['seen'] is a set")
    assert exc.value.path == ("user", "seen")


def test_rich_payloads_reach_the_record_and_back(url: str, qname: str, r: redis.Redis) -> None:
    q = Queue.from_url(url, qname, QueueConfig(serde=JsonSerde(classes=[Color, Point])))
    payload = {**RICH, "c": Color.RED, "p": Point(1, dt.date(2000, 1, 1))}
    job = q.enqueue("t", payload)
    info = q.get(job.job_id)
    assert info is not None and info.payload == payload
