"""A loader for the subset of YAML the deploy recipes are written in (PyYAML is not a
dependency of the test suite): block mappings and sequences, ``---`` between documents,
comments, plain and double-quoted scalars, flow sequences (JSON-like, may span lines), ``{}``,
and one anchor with merge keys (``&name`` on a mapping, ``<<: *name``). Anything else raises
``ValueError`` (the recipes stay in the subset, so a typo is caught rather than misread)."""

from __future__ import annotations

import json
import re
from typing import Any

_KEY = re.compile(r"^([A-Za-z0-9_.<>/-]+):(?:\s+(.*))?$")


def _strip_comment(line: str) -> str:
    quoted = False
    for i, ch in enumerate(line):
        if ch == '"' and (i == 0 or line[i - 1] != "\\"):
            quoted = not quoted
        elif ch == "#" and not quoted and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _scalar(text: str) -> Any:
    text = text.strip()
    if text.startswith("[") or text.startswith("{"):
        return json.loads(text)
    if text.startswith('"'):
        return json.loads(text)
    if text.startswith(("'", "&", "*", "|", ">", "!")):
        raise ValueError(f"outside the YAML subset: {text!r}")
    if text in ("true", "false"):
        return text == "true"
    if text in ("null", "~", ""):
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def _lines(text: str) -> list[list[tuple[int, str]]]:
    """Documents of (indent, content) lines, comments and blanks dropped, flow collections
    joined onto one line."""
    docs: list[list[tuple[int, str]]] = [[]]
    pending: tuple[int, str] | None = None
    for raw in text.splitlines():
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise ValueError("tabs in indentation")
        line = _strip_comment(raw)
        if pending is not None:
            pending = (pending[0], pending[1] + " " + line.strip())
        elif not line.strip():
            continue
        elif line.strip() == "---":
            docs.append([])
            continue
        else:
            pending = (len(line) - len(line.lstrip()), line.strip())
        body = pending[1]
        if body.count("[") - body.count("]") > 0 or body.count("{") - body.count("}") > 0:
            continue  # a flow collection goes on
        docs[-1].append(pending)
        pending = None
    if pending is not None:
        raise ValueError(f"unclosed flow collection: {pending[1]!r}")
    return [d for d in docs if d]


class _Parser:
    def __init__(self, lines: list[tuple[int, str]]) -> None:
        self.lines = lines
        self.i = 0
        self.anchors: dict[str, Any] = {}

    def block(self, indent: int) -> Any:
        first_indent, first = self.lines[self.i]
        if first.startswith("- ") or first == "-":
            return self.sequence(first_indent)
        return self.mapping(first_indent)

    def _value(self, rest: str | None, indent: int) -> Any:
        anchor = None
        if rest is not None and rest.startswith("&"):
            anchor, rest = rest[1:], None
        if rest is None or rest == "":
            nxt = self.lines[self.i] if self.i < len(self.lines) else None
            if nxt is not None and (nxt[0] > indent or (nxt[0] == indent
                                                        and nxt[1].startswith("- "))):
                value = self.block(nxt[0])
            else:
                value = None
        elif rest.startswith("*"):
            value = self.anchors[rest[1:]]
        else:
            value = _scalar(rest)
        if anchor is not None:
            self.anchors[anchor] = value
        return value

    def mapping(self, indent: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while self.i < len(self.lines):
            ind, text = self.lines[self.i]
            if ind < indent or (ind == indent and text.startswith("- ")):
                break
            if ind > indent:
                raise ValueError(f"unexpected indentation: {text!r}")
            m = _KEY.match(text)
            if m is None:
                raise ValueError(f"not a key: {text!r}")
            self.i += 1
            key, rest = m[1], m[2]
            value = self._value(rest, ind)
            if key == "<<":
                if not isinstance(value, dict):
                    raise ValueError("a merge key needs a mapping")
                out = {**value, **out}
            elif key in out:
                raise ValueError(f"duplicate key {key!r}")
            else:
                out[key] = value
        return out

    def sequence(self, indent: int) -> list[Any]:
        out: list[Any] = []
        while self.i < len(self.lines):
            ind, text = self.lines[self.i]
            if ind != indent or not (text.startswith("- ") or text == "-"):
                if ind > indent:
                    raise ValueError(f"unexpected indentation: {text!r}")
                break
            item = text[2:].strip()
            if _KEY.match(item) and not item.startswith('"'):
                # a mapping in the item: its first key sits two columns in
                self.lines[self.i] = (ind + 2, item)
                out.append(self.mapping(ind + 2))
            else:
                self.i += 1
                out.append(self._value(item, ind))
        return out


def load_all(text: str) -> list[Any]:
    """Every document of ``text``."""
    out = []
    for doc in _lines(text):
        p = _Parser(doc)
        out.append(p.block(doc[0][0]))
        if p.i != len(doc):
            raise ValueError(f"left over: {doc[p.i][1]!r}")
    return out
