"""Serialisation of envelopes and results. JSON by default; never pickle (no code from data)."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import json.encoder
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from .errors import InvalidArgument, SerializationError

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


TAG = "__streamq__"
"""The key that marks a value the JSON serde encoded for a type JSON does not have."""
_TAG_TEXT = f'"{TAG}"'


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def render_path(path: Sequence[str | int]) -> str:
    return "".join(f"[{p!r}]" for p in path)


class JsonSerde:
    """The default: compact UTF-8 JSON. NaN and infinities are refused (not valid JSON).

    Beyond plain JSON data it encodes ``datetime``, ``date``, ``time``, ``UUID`` and
    ``Decimal`` (read back as the same type), enum members and attrs instances (read back as
    the same type when their class is listed in ``classes``, else as their plain value or
    dict). ``default`` is called with any other object and returns plain data to encode
    in its place (like ``json.dumps(default=...)``; raise TypeError to refuse it). The key
    ``"__streamq__"`` is reserved in mappings."""

    name = "json"

    def __init__(self, *, default: Callable[[Any], Any] | None = None,
                 classes: Iterable[type] = ()) -> None:
        self._user_default = default
        self._classes = {_qualname(c): c for c in classes}
        for c in self._classes.values():
            if not (isinstance(c, type) and (issubclass(c, enum.Enum) or attrs.has(c))):
                raise InvalidArgument(f"classes: {c!r} is not an enum or an attrs class")
        enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                               default=self._default)
        self._encode = enc.encode
        # The C encoder, built once (JSONEncoder.encode builds it on every call). Without
        # circular-reference markers a cycle ends in RecursionError, which is caught below.
        make = getattr(json.encoder, "c_make_encoder", None)
        self._c = None if make is None else make(
            None, self._default, json.encoder.encode_basestring, None, ":", ",", False, False,
            False)
        self._dec = json.JSONDecoder()
        # the decoder's own scanner (C), set by JSONDecoder.__init__; typeshed omits it
        self._scan: Callable[[str, int], tuple[Any, int]] = \
            self._dec.scan_once  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt on unpickling (Spark ships it to executors)
        if self._user_default is None and not self._classes:
            return (JsonSerde, ())
        return (_rebuild_json, (self._user_default, tuple(self._classes.values())))

    def _default(self, obj: Any) -> Any:
        """Called by the encoder for what JSON has no type for."""
        t = type(obj)
        if t is dt.datetime:
            tagged: dict[str, Any] = {TAG: "datetime", "v": obj.isoformat()}
        elif t is dt.date:
            tagged = {TAG: "date", "v": obj.isoformat()}
        elif t is dt.time:
            tagged = {TAG: "time", "v": obj.isoformat()}
        elif t is uuid.UUID:
            tagged = {TAG: "uuid", "v": str(obj)}
        elif t is decimal.Decimal:
            tagged = {TAG: "decimal", "v": str(obj)}
        elif isinstance(obj, enum.Enum):
            tagged = {TAG: "enum", "c": _qualname(t), "v": obj.value}
        elif attrs.has(t):
            tagged = {TAG: "attrs", "c": _qualname(t),
                      "v": {a.name: getattr(obj, a.name) for a in attrs.fields(t)}}
        elif self._user_default is not None:
            return self._user_default(obj)
        else:
            raise TypeError(f"Object of type {t.__name__} is not JSON serializable")
        return tagged

    def _restore_all(self, value: Any) -> Any:
        """Rebuild tagged values bottom-up, as an object hook would (none is passed to the
        decoder: tests/test_security_data.py keeps every decoder free of hooks that build
        objects from data; _restore builds only the listed types)."""
        if isinstance(value, dict):
            return self._restore({k: self._restore_all(v) for k, v in value.items()})
        if isinstance(value, list):
            return [self._restore_all(v) for v in value]
        return value

    def _restore(self, d: dict[str, Any]) -> Any:
        tag = d.get(TAG)
        if tag is None:
            return d
        v = d.get("v")
        try:
            if tag == "datetime":
                return dt.datetime.fromisoformat(v)  # type: ignore[arg-type]
            if tag == "date":
                return dt.date.fromisoformat(v)  # type: ignore[arg-type]
            if tag == "time":
                return dt.time.fromisoformat(v)  # type: ignore[arg-type]
            if tag == "uuid":
                return uuid.UUID(v)
            if tag == "decimal":
                return decimal.Decimal(v)  # type: ignore[arg-type]
            if tag in ("enum", "attrs"):
                cls = self._classes.get(d.get("c", ""))
                if cls is None:
                    return v  # a class this reader was not given: its plain value
                return cls(v) if tag == "enum" else cls(**v)  # type: ignore[arg-type]
        except (TypeError, ValueError, decimal.InvalidOperation) as exc:
            raise SerializationError(f"not valid streamq JSON: bad {tag} value {v!r}") from exc
        raise SerializationError(f"not valid streamq JSON: unknown {TAG} tag {tag!r}")

    def dumps(self, obj: Any) -> bytes:
        _check_keys(obj)
        try:
            text = "".join(self._c(obj, 0)) if self._c is not None else self._encode(obj)
            data = text.encode()  # a lone surrogate fails here
        except Exception as exc:  # TypeError, ValueError, RecursionError, or a mapping's own
            raise self._explain(obj, exc) from exc
        if _TAG_TEXT in text:
            path = _reserved_key_at(obj)
            if path is not None:
                raise SerializationError(
                    f"the mapping key {TAG!r} is reserved by streamq's JSON serde (at"
                    f" {render_path(path) or 'the top level'}); rename it", path=tuple(path))
        return data

    def _explain(self, obj: Any, exc: BaseException) -> SerializationError:
        """Find the value that failed and name its key path."""
        found = _find_bad(obj, self._leaf_ok)
        if found is None:
            return SerializationError(f"not JSON-serialisable: {exc}", path=None)
        path, value, why = found
        where = render_path(path) or "the value itself"
        return SerializationError(
            f"not JSON-serialisable: {where} is {why} {_short(value)}; convert it to plain"
            " data (or pass default= to JsonSerde)",
            path=tuple(path))

    def _leaf_ok(self, value: Any) -> str | None:
        try:
            ("".join(self._c(value, 0)) if self._c is not None else self._encode(value)).encode()
        except Exception as exc:  # noqa: BLE001 - only the reason is wanted
            if isinstance(value, float):
                return "a NaN or an infinity (JSON has neither)"
            return f"a {type(value).__name__}" if isinstance(exc, TypeError) else str(exc)
        return None

    def loads(self, data: bytes) -> Any:
        try:
            text = data.decode()
            try:  # what this serde writes has no whitespace around it: scan it at once
                obj, end = self._scan(text, 0)
            except StopIteration:
                end = -1
            if end != len(text):  # whitespace around, extra data or nothing: decode() says
                obj = self._dec.decode(text)
            if _TAG_TEXT in text:
                return self._restore_all(obj)
            return obj
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            if isinstance(exc, SerializationError):
                raise
            raise SerializationError(f"not valid JSON: {exc}") from exc


def _rebuild_json(default: Callable[[Any], Any] | None, classes: tuple[type, ...]
                  ) -> JsonSerde:
    return JsonSerde(default=default, classes=classes)


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a huge int, or an object's own repr failing
        return f"(a {type(value).__name__})"
    return f"({text[:60]}...)" if len(text) > 60 else f"({text})"


_MAX_PATH = 100


def _find_bad(obj: Any, leaf_ok: Callable[[Any], str | None]
              ) -> tuple[list[str | int], Any, str | None] | None:
    """The first value (depth first) that cannot be encoded: its key path, it, and why."""
    stack: list[tuple[list[str | int], Any]] = [([], obj)]
    seen: set[int] = set()
    while stack:
        path, o = stack.pop()
        if len(path) > _MAX_PATH:  # the search stays cheap on pathological nesting
            return path, o, f"nested more than {_MAX_PATH} levels deep (or more)"
        if attrs.has(type(o)) and not isinstance(o, type):
            stack.extend(([*path, a.name], getattr(o, a.name))
                         for a in reversed(attrs.fields(type(o))))
            continue
        if type(o) in (dict, list, tuple):
            if id(o) in seen:
                return path, o, "a reference cycle"
            seen.add(id(o))
            items = list(o.items()) if type(o) is dict else list(enumerate(o))
            stack.extend(([*path, k], v) for k, v in reversed(items))
            continue
        why = leaf_ok(o)
        if why is not None:
            return path, o, why
    return None


def _reserved_key_at(obj: Any) -> list[str | int] | None:
    """The path of a caller's mapping that uses the reserved key, if any."""
    stack: list[tuple[list[str | int], Any]] = [([], obj)]
    seen: set[int] = set()
    while stack:
        path, o = stack.pop()
        if id(o) in seen:
            continue
        if isinstance(o, dict):
            seen.add(id(o))
            if TAG in o:
                return path
            stack.extend(([*path, k], v) for k, v in o.items())
        elif isinstance(o, list | tuple):
            seen.add(id(o))
            stack.extend(([*path, i], v) for i, v in enumerate(o))
        elif attrs.has(type(o)) and not isinstance(o, type):
            stack.extend(([*path, a.name], getattr(o, a.name)) for a in attrs.fields(type(o)))
    return None


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

