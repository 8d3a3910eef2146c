"""Serialisation of envelopes and results. JSON by default; never pickle (no code from data)."""

from __future__ import annotations

import json
import json.encoder
from typing import Any, Protocol, runtime_checkable

from ._errors import SerializationError

_SCALARS = frozenset({str, int, float, bool, type(None), bytes})


def _plain_ok(obj: Any, depth: int) -> bool:
    """The common case, fast: exact dicts with str keys, lists and tuples, scalars, at most
    ``depth`` levels deep. False means 'not sure', and the careful walk below decides."""
    if depth == 0:
        return False
    if type(obj) is dict:
        for k, v in obj.items():
            if type(k) is not str:
                return False
            tv = type(v)
            if tv not in _SCALARS and not (
                (tv is dict or tv is list or tv is tuple) and _plain_ok(v, depth - 1)
            ):
                return False
        return True
    for v in obj:
        tv = type(v)
        if tv not in _SCALARS and not (
            (tv is dict or tv is list or tv is tuple) and _plain_ok(v, depth - 1)
        ):
            return False
    return True


def _check_keys(obj: Any, allowed: type | tuple[type, ...] = str) -> None:
    """Refuse mapping keys the format would silently change or refuse to read back: JSON turns
    1, 1.5, True and None into strings ({1: "a", "1": "b"} would lose a value); a msgpack
    reader with strict_map_key takes only str and bytes. Iterative (no depth limit); visits
    containers only, each once (cycles end here and fail in the encoder)."""
    if not isinstance(obj, dict | list | tuple) or _plain_ok(obj, 4):
        return
    stack = [obj]
    seen: set[int] = set()
    push = stack.append
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, dict):
            for k, v in o.items():
                if type(k) is not str and not isinstance(k, allowed):
                    raise SerializationError(f"mapping keys must be strings, got {k!r}")
                if isinstance(v, dict | list | tuple):
                    push(v)
        else:
            for v in o:
                if isinstance(v, dict | list | tuple):
                    push(v)


@runtime_checkable
class Serde(Protocol):
    """Turns plain data (dicts, lists, str, int, float, bool, None) into bytes and back."""

    name: str

    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JsonSerde:
    """The default: compact UTF-8 JSON. NaN and infinities are refused (not valid JSON)."""

    name = "json"

    def __init__(self) -> None:
        enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        self._encode = enc.encode
        # The C encoder, built once (JSONEncoder.encode builds it on every call). Without
        # circular-reference markers a cycle ends in RecursionError, which is caught below.
        make = getattr(json.encoder, "c_make_encoder", None)
        self._c = None if make is None else make(
            None, enc.default, json.encoder.encode_basestring, None, ":", ",", False, False,
            False)
        self._dec = json.JSONDecoder()

    def __reduce__(self) -> tuple[type[JsonSerde], tuple[()]]:
        return (JsonSerde, ())  # rebuilt on unpickling (Spark ships it to executors)

    def dumps(self, obj: Any) -> bytes:
        _check_keys(obj)
        try:
            if self._c is not None:
                return "".join(self._c(obj, 0)).encode()
            return self._encode(obj).encode()
        except Exception as exc:  # TypeError, ValueError, RecursionError, or a mapping's own
            raise SerializationError(f"not JSON-serialisable: {exc}") from exc

    def loads(self, data: bytes) -> Any:
        try:
            return self._dec.decode(data.decode())
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise SerializationError(f"not valid JSON: {exc}") from exc


class MsgpackSerde:
    """MessagePack (``pip install 'streamq[msgpack]'``): smaller and faster for binary data."""

    name = "msgpack"

    def __init__(self) -> None:
        import msgpack  # optional extra

        self._msgpack = msgpack

    def __reduce__(self) -> tuple[type[MsgpackSerde], tuple[()]]:
        return (MsgpackSerde, ())

    def dumps(self, obj: Any) -> bytes:
        _check_keys(obj, (str, bytes))  # what loads() accepts (strict_map_key)
        try:
            data: bytes = self._msgpack.packb(obj, use_bin_type=True)
        except Exception as exc:  # TypeError, ValueError, OverflowError, or a mapping's own
            raise SerializationError(f"not msgpack-serialisable: {exc}") from exc
        return data

    def loads(self, data: bytes) -> Any:
        try:
            return self._msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types
            raise SerializationError(f"not valid msgpack: {exc}") from exc


def dumps_str_keys(serde: Serde, obj: Any) -> bytes:
    """``serde.dumps(obj)`` for data whose mappings the caller built with str keys only
    (rows from a schema): the default JSON serde skips its key walk; others dump as usual."""
    if type(serde) is JsonSerde and serde._c is not None:
        try:
            return "".join(serde._c(obj, 0)).encode()
        except Exception as exc:
            raise SerializationError(f"not JSON-serialisable: {exc}") from exc
    return serde.dumps(obj)

