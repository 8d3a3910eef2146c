"""Serialisation of envelopes and results. JSON by default; never pickle (no code from data)."""

from __future__ import annotations

import json
import json.encoder
from typing import Any, Protocol, runtime_checkable

from ._errors import SerializationError


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
        try:
            if self._c is not None:
                return "".join(self._c(obj, 0)).encode()
            return self._encode(obj).encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise SerializationError(f"not JSON-serialisable: {exc}") from exc

    def loads(self, data: bytes) -> Any:
        try:
            return self._dec.decode(data.decode())
        except (UnicodeDecodeError, ValueError) as exc:
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
        try:
            data: bytes = self._msgpack.packb(obj, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerializationError(f"not msgpack-serialisable: {exc}") from exc
        return data

    def loads(self, data: bytes) -> Any:
        try:
            return self._msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types
            raise SerializationError(f"not valid msgpack: {exc}") from exc
