"""The script registry sends each script with only the shared helpers it needs."""

from __future__ import annotations

import re
from importlib import resources

import redis

from streamq._core.scripts import SCRIPTS, _chunks, _code, shaken

_LIB = "\n".join((resources.files("streamq") / "lua" / n).read_text()
                 for n in ("_lib.lua", "_groups.lua", "_rate.lua"))


def _defined(source: str) -> set[str]:
    return {n for d, _u, _t in _chunks(source) for n in d}


def test_the_helpers_split_into_statements_that_add_up_to_the_whole() -> None:
    assert "\n".join(t for _d, _u, t in _chunks(_LIB)) == _LIB.rstrip("\n")
    # a forward declaration over several lines names every helper it declares
    declared = next(d for d, _u, t in _chunks(_LIB) if "gctx" in d and t.startswith("local "))
    assert {"gctx", "g_adopt", "g_enter"} <= declared


def test_each_script_keeps_every_helper_it_uses_and_drops_others() -> None:
    lib_names = _defined(_LIB)
    for name, script in SCRIPTS.items():
        body = (resources.files("streamq") / "lua" / f"{name}.lua").read_text()
        kept = _defined(script.source[:-len(body)])
        used = set(re.findall(r"[A-Za-z_]\w*", _code(script.source))) & lib_names
        assert used <= kept, (name, sorted(used - kept))
    assert len(SCRIPTS["ticket"].source) < len(_LIB) // 4  # ticket.lua needs next to nothing


def test_a_helper_used_only_through_another_is_kept() -> None:
    lib = ("local function a() return 1 end\n"
           "local function b() return a() + 1 end\n"
           "local function c() return 3 end\n"
           "local x, y\n"
           "function y() return b() end\n")
    out = shaken(lib, "return y()")
    assert "function b()" in out and "function a()" in out and "local x, y" in out
    assert "function c()" not in out


def test_every_shaken_script_compiles(url: str) -> None:
    r = redis.Redis.from_url(url)
    for script in SCRIPTS.values():
        assert r.script_load(script.source) == script.sha
