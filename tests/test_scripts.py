"""The script registry sends each script with only the shared helpers it needs."""

from __future__ import annotations

import re
from importlib import resources

import redis

from streamq._core.scripts import _LOADERS, SCRIPTS, _chunks, _code, shaken

_LIB = "\n".join((resources.files("streamq") / "lua" / n).read_text()
                 for n in ("_lib.lua", "_groups.lua", "_rate.lua"))


def _defined(source: str) -> set[str]:
    return {n for d, _u, _t in _chunks(source) for n in d}


def test_the_helpers_split_into_statements_that_add_up_to_the_whole() -> None:
    assert "\n".join(t for _d, _u, t in _chunks(_LIB)) == _LIB.rstrip("\n")
    declared = next(d for d, _u, t in _chunks(_LIB)
                    if "lib_groups" in d and t.startswith("local "))
    assert {"lib_groups", "lib_rate"} <= declared
    # a forward declaration over several lines names every helper it declares
    lib = "local a, b,\n  c, d\nfunction c() return 1 end\n"
    assert _chunks(lib)[0][0] == {"a", "b", "c", "d"}


def _made_on_need() -> dict[str, str]:
    """Each helper a loader makes (scripts._LOADERS) -> its loader."""
    made: dict[str, str] = {}
    for loader, var in _LOADERS:
        for defines, _u, text in _chunks(_LIB):
            if loader in defines and f"{var} = {{" in text:
                table = text[text.index(f"{var} = {{"):]
                for n in re.findall(r"\b(\w+)\s*=\s*\1\b", table[:table.index("}")]):
                    made[n] = loader
    return made


def test_a_helper_made_on_first_need_is_never_named_bare() -> None:
    """Outside its loader, a helper of lib_cold, lib_groups or lib_rate is named only as
    <loader>().<name> or through the locals cold_first gives a script: a bare name would be
    an undefined global on a path that tests might not take."""
    made = _made_on_need()
    assert {"bury", "rec", "gctx", "g_release", "rate_take"} <= set(made)
    bare = re.compile(r"(?<![\w.])(" + "|".join(made) + r")\b")
    for name, script in SCRIPTS.items():
        src = script.source
        for loader, var in _LOADERS:  # the loaders' own text
            a = src.find(f"function {loader}()")
            if a >= 0:
                src = src[:a] + src[src.index(f"\n  return {var}\nend\n", a):]
        declared: set[str] = set()
        for m in re.finditer(r"^local _\w+ = lib_\w+\(\)\nlocal ([\w, ]+) =", src, re.M):
            declared |= {x.strip() for x in m.group(1).split(",")}
        for line in src.splitlines():
            code = re.sub(r"'[^']*'", "''", line.split("--")[0])
            for n in bare.findall(code):
                assert n in declared, (name, line)


def test_enqueue_and_finish_make_no_rare_helper_on_their_common_path() -> None:
    for name in ("enqueue", "finish"):
        head = SCRIPTS[name].source.split("\n-- " + name + ".lua:")[0]
        assert not re.search(r"^local _\w+ = lib_\w+\(\)$", head, re.M), name


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
