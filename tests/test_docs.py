"""The examples of docs/*.md run as tests.

Every ```python block runs with ``exec`` in a fresh namespace whose ``REDIS_URL`` points at the
private test server, except blocks whose first line is ``# not run``. A block is named by its
page and its index among the page's python blocks (``getting-started.md#2``); tracebacks carry
the Markdown file's own line numbers.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import attrs
import pytest

import streamq
from streamq._core.server import RedisServer

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = ("index.md", "getting-started.md", "delivery-semantics.md", "errors.md", "key-layout.md",
         "scheduling.md", "operations.md", "testing.md", "fastapi.md", "scaling.md",
         "fairness.md", "dedup.md", "workflows.md")
NOT_RUN = "# not run"
FILE = "# file: "
"""A block that is a file of an example project: written out and run with pytest."""
PENDING_PAGES = frozenset({"performance.md"})
"""Pages that may be linked before they are written."""

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)\s]*)?\)")


class Example(NamedTuple):
    page: Path
    position: int
    """Index among the page's python blocks, skipped ones included."""
    line: int
    """Lines of the page before the block's first line."""
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.name}#{self.position}"


def _examples() -> list[Example]:
    out: list[Example] = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for index, match in enumerate(_FENCE.finditer(text)):
            code = match.group(1)
            if code.lstrip().startswith((NOT_RUN, FILE)):
                continue
            out.append(Example(page, index, text.count("\n", 0, match.start(1)), code))
    return out


EXAMPLES = _examples()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("example", [
    pytest.param(e, id=e.name, marks=[pytest.mark.cluster] if "CLUSTER_URL" in e.code else [])
    for e in EXAMPLES])
def test_example(redis_server: RedisServer, example: Example,
                 request: pytest.FixtureRequest) -> None:
    # leading newlines make tracebacks point at the lines of the .md file
    compiled = compile("\n" * example.line + example.code, str(example.page), "exec")
    module = "docs_example_" + re.sub(r"\W", "_", example.page.stem)
    namespace: dict[str, object] = {"__name__": module, "REDIS_URL": redis_server.url}
    if "CLUSTER_URL" in example.code:  # a Redis Cluster example: the session's loopback cluster
        namespace["CLUSTER_URL"] = request.getfixturevalue("redis_cluster").url
    exec(compiled, namespace)


_FILE_FENCE = re.compile(r"^```(?:python|toml|ini)[ \t]*\n(# file: .*?)^```[ \t]*$",
                         re.MULTILINE | re.DOTALL)


def _project_files(page: Path) -> dict[str, str]:
    """The page's ``# file:`` blocks (Python, TOML, ini), by path."""
    out: dict[str, str] = {}
    for match in _FILE_FENCE.finditer(page.read_text(encoding="utf-8")):
        name, _, body = match.group(1).partition("\n")
        out[name.removeprefix(FILE).strip()] = body
    return out


PROJECTS = [p for p in sorted(DOCS.glob("*.md")) if _project_files(p)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("page", PROJECTS, ids=[p.name for p in PROJECTS])
def test_example_projects_pass_their_own_tests(page: Path, tmp_path: Path) -> None:
    """The `# file:` blocks of a page, written out as they are into an empty directory, pass
    `pytest -p streamq.testing` run there the way a user runs it: the `pytest` command, no
    PYTHONPATH, no file added (the page's layout has to work as written)."""
    files = _project_files(page)
    for name, body in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "STREAMQ_TEST_URL", "PYTEST_ADDOPTS")}
    pytest_command = str(Path(sys.executable).parent / "pytest")
    proc = subprocess.run([pytest_command, "-p", "streamq.testing", "-q",
                           "-p", "no:cacheprovider"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tests = sum(body.count("\ndef test_") + body.count("\nasync def test_")
                for name, body in files.items() if Path(name).name.startswith("test_"))
    assert re.search(rf"^{tests} passed in ", proc.stdout, re.M), proc.stdout  # none skipped


def test_pages_exist_and_have_examples() -> None:
    for name in PAGES:
        assert (DOCS / name).is_file(), f"docs/{name} is missing"
    tested = {e.page.name for e in EXAMPLES}
    for name in PAGES:
        if name != "index.md":
            assert name in tested, f"docs/{name} has no tested example"


def test_relative_links_resolve() -> None:
    for page in sorted(DOCS.glob("*.md")):
        for target in _LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target in PENDING_PAGES:
                continue
            assert (page.parent / target).is_file(), f"{page.name} links to missing {target}"


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_every_exported_error_is_documented() -> None:
    text = _page("errors.md")
    for name in streamq.__all__:
        obj = getattr(streamq, name)
        if isinstance(obj, type) and issubclass(obj, (streamq.StreamqError, streamq.Retry,
                                                      streamq.Fail)):
            assert f"`{name}`" in text, f"errors.md does not document {name}"


def test_every_config_field_is_documented() -> None:
    text = _page("getting-started.md")
    for cls in (streamq.QueueConfig, streamq.WorkerConfig, streamq.RetryPolicy):
        for field in attrs.fields(cls):
            assert f"| `{field.name}` |" in text, f"{cls.__name__}.{field.name} is not documented"


def test_every_key_is_documented() -> None:
    text = _page("key-layout.md")
    keys = streamq.Keys("Q")
    placeholders = {"job_id": "<id>", "consumer": "<consumer>", "tag": "<tag>",
                    "level": "<level>", "token_prefix": "<token prefix>", "key": "<key>",
                    "job_type": "<type>", "group": "<group>", "field": "<field>",
                    "value": "<value>"}
    for name, member in inspect.getmembers(streamq.Keys):
        if name.startswith("_") or name in ("base", "queue", "prefix", "shard", "tag",
                                            "of_shard", "for_job", "group_keys",
                                            "shard_tag", "level", "at_level",
                                            "level_streams"):  # not key names
            continue
        if isinstance(member, property):
            key = getattr(keys, name)
        elif inspect.isfunction(member):
            params = list(inspect.signature(member).parameters)[1:]
            key = getattr(keys, name)(*(placeholders[p] for p in params))
        else:
            continue
        assert f"`{key}`" in text, f"key-layout.md does not list {key} (Keys.{name})"
