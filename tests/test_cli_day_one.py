"""The command line as a new user meets it (issue 19): options before or after the command,
typos refused the same way everywhere with "did you mean", queues with jobs and no worker,
`queues forget`, registry import errors that name the file and line, `enqueue` with every
option and a payload from a file or stdin, `cron list`, and the error lines the docs promise."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from schedulers import Cron, Scheduler, SchedulerConfig
from streamq import InvalidArgument, Queue, QueueConfig, UnknownJobType
from streamq._core.queues import publish_types, registered_types
from streamq._ops.queues import forget

TESTS = Path(__file__).parent
DOCS = TESTS.parent / "docs"


def cli(*args: str, stdin: str | None = None, cwd: Path = TESTS
        ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMQ_URL", "STREAMQ_PREFIX")}
    return subprocess.run([sys.executable, "-m", "streamq", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60, input=stdin)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamq: "), proc.stderr
    return lines[0]


def test_common_options_work_before_and_after_the_command(url: str, qname: str) -> None:
    Queue.from_url(url, qname).enqueue("t", {"a": 1})
    after = cli("stats", qname, "--url", url, "--json")
    before = cli("--url", url, "--json", "stats", qname)
    mixed = cli("--json", "stats", qname, "--url", url)
    for proc in (after, before, mixed):
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)[0]["ready"] == 1
    debug = cli("--debug", "stats", qname, "--url", "redis://127.0.0.1:1/0")
    assert "Traceback" in debug.stderr
    assert cli("--log-level", "DEBUG", "stats", qname, "--url", url).returncode == 0


def test_every_command_refuses_an_unknown_queue_with_did_you_mean(url: str, qname: str) -> None:
    Queue.from_url(url, qname).enqueue("t", job_id="j1")
    typo = qname[:-1] + ("x" if qname[-1] != "x" else "y")
    commands = [("stats", typo), ("pending", typo), ("job", typo, "j1"), ("dead", "list", typo),
                ("dead", "purge", typo, "--yes"), ("requeue", typo, "j1"),
                ("cancel", typo, "j1"), ("pause", typo), ("resume", typo),
                ("consumers", typo), ("purge", typo, "--state", "queued", "--yes"),
                ("enqueue", typo, "t", "{}"), ("cron", "list", typo)]
    for args in commands:
        line = one_error_line(cli(*args, "--url", url))
        assert f"queue {typo!r} does not exist" in line, (args, line)
        # the closest name first; other queues of the shared server may follow ("or ...")
        assert re.search(rf"did you mean {re.escape(repr(qname))}( or '[^']+')*\?", line), (
            args, line)
    assert "--create" in one_error_line(cli("enqueue", typo, "t", "{}", "--url", url))
    assert cli("enqueue", typo, "t", "{}", "--create", "--url", url).returncode == 0
    assert cli("stats", typo, "--url", url).returncode == 0  # now it exists


def test_stats_lists_queues_with_jobs_and_no_worker(url: str, qname: str) -> None:
    """A producer adds its queue to the known queues: a misspelt queue shows in `stats`."""
    Queue.from_url(url, qname).enqueue("t")
    out = cli("stats", "--url", url)
    assert out.returncode == 0, out.stderr
    assert re.search(rf"^{re.escape(qname)}\s+1\s", out.stdout, re.M), out.stdout
    assert f"note: {qname!r} has jobs waiting and no live worker" in out.stdout


def test_stats_of_all_queues_skips_a_registered_queue_whose_keys_are_gone(
        url: str, qname: str, r: redis.Redis) -> None:
    Queue.from_url(url, qname).enqueue("t")
    r.sadd("streamq:queues", f"{qname}-gone")  # known once; its keys purged since
    out = cli("stats", "--url", url)
    assert out.returncode == 0, out.stderr
    assert re.search(rf"^{re.escape(qname)}\s", out.stdout, re.M)
    assert f"{qname}-gone" not in out.stdout
    assert "does not exist" in one_error_line(cli("stats", f"{qname}-gone", "--url", url))


def test_queues_forget_refuses_while_the_queue_has_jobs(url: str, qname: str,
                                                         r: redis.Redis) -> None:
    q = Queue.from_url(url, qname)
    res = q.enqueue("t")
    assert qname in cli("queues", "list", "--url", url).stdout.split()
    line = one_error_line(cli("queues", "forget", qname, "--url", url))
    assert f"queue {qname!r} still has 1 jobs (1 ready" in line and "--force" in line
    q.cancel(res.job_id)
    done = cli("queues", "forget", qname, "--url", url)
    assert done.returncode == 0 and f"{qname}: forgotten" in done.stdout, done.stderr
    assert not r.sismember("streamq:queues", qname)
    q.enqueue("t")  # a new Queue object notes it again
    Queue.from_url(url, qname).enqueue("t")
    assert r.sismember("streamq:queues", qname)
    forced = cli("queues", "forget", qname, "--force", "--json", "--url", url)
    assert json.loads(forced.stdout) == {"queue": qname, "forgotten": True}
    with pytest.raises(InvalidArgument, match="--force"):
        forget(r, q.keys)  # the library call refuses the same way (nothing to forget: ok)
    unknown = one_error_line(cli("queues", "forget", qname + "-nope", "--url", url))
    assert "does not exist" in unknown


def _project(tmp_path: Path, body: str) -> Path:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tasks.py").write_text(textwrap.dedent(body))
    return tmp_path


@pytest.mark.parametrize(("body", "expected"), [
    ("""\
     from streamq import Registry
     registry = Registry()
     x = undefined_name
     """, r"importing myapp\.tasks failed at .*myapp/tasks\.py line 3: NameError: name"
          r" 'undefined_name' is not defined \(--debug shows the traceback\)"),
    ("""\
     from streamq import Registry
     registry = Registry(
     """, r"importing myapp\.tasks failed at .*myapp/tasks\.py line 2: SyntaxError"),
    ("""\
     import no_such_dependency_xyz
     """, r"importing myapp\.tasks failed at .*myapp/tasks\.py line 1: ModuleNotFoundError:"
          r" No module named 'no_such_dependency_xyz'"),
    ("""\
     from streamq import Registry
     regsitry = Registry()
     """, r"module myapp\.tasks \(.*tasks\.py\) has no attribute 'registry'; it has"
          r" Registry, regsitry"),
])
def test_registry_import_errors_name_module_file_and_line(tmp_path: Path, body: str,
                                                           expected: str) -> None:
    cwd = _project(tmp_path, body)
    line = one_error_line(cli("worker", "myapp.tasks:registry", "--queue", "q",
                              "--url", "redis://127.0.0.1:1/0", cwd=cwd))
    assert re.search(expected, line), line
    assert line.startswith("streamq: cannot load registry 'myapp.tasks:registry': ")


def test_registry_import_error_traceback_under_debug(tmp_path: Path) -> None:
    cwd = _project(tmp_path, "x = 1 / 0\n")
    proc = cli("--debug", "worker", "myapp.tasks:registry", "--queue", "q", cwd=cwd)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ZeroDivisionError" in proc.stderr
    assert "line 1: ZeroDivisionError: division by zero" in proc.stderr.splitlines()[-1]
    missing = one_error_line(cli("worker", "nope_module:registry", "--queue", "q", cwd=cwd))
    assert "no module named 'nope_module'" in missing and str(cwd) in missing


def test_enqueue_reads_the_payload_from_a_file_or_stdin(url: str, qname: str,
                                                       tmp_path: Path) -> None:
    q = Queue.from_url(url, qname)
    (tmp_path / "p.json").write_text('{"to": "a@example.com", "n": [1, 2]}')
    ok = cli("enqueue", qname, "email.send", f"@{tmp_path / 'p.json'}", "--id", "f1",
             "--create", "--url", url)
    assert ok.returncode == 0 and "f1: queued" in ok.stdout, ok.stderr
    assert (info := q.get("f1")) is not None and info.payload == {"to": "a@example.com",
                                                                  "n": [1, 2]}
    piped = cli("enqueue", qname, "email.send", "-", "--id", "s1", "--url", url,
                stdin='["from", "stdin"]')
    assert piped.returncode == 0, piped.stderr
    assert (info := q.get("s1")) is not None and info.payload == ["from", "stdin"]
    none = cli("enqueue", qname, "tick", "--id", "n1", "--url", url)
    assert none.returncode == 0 and (info := q.get("n1")) is not None and info.payload is None
    line = one_error_line(cli("enqueue", qname, "t", "@/no/such/file.json", "--url", url))
    assert "cannot read the payload file '/no/such/file.json'" in line
    (tmp_path / "bad.json").write_text("{oops")
    line = one_error_line(cli("enqueue", qname, "t", f"@{tmp_path / 'bad.json'}", "--url", url))
    assert f"payload in {tmp_path / 'bad.json'} is not valid JSON" in line


def test_enqueue_takes_every_enqueue_option(url: str, qname: str) -> None:
    q = Queue.from_url(url, qname)
    out = cli("enqueue", qname, "report.render", '{"id": 7}', "--create", "--id", "o1",
              "--run-at", "2099-01-01T00:00:00", "--deadline", "2d", "--max-attempts", "5",
              "--result-ttl", "1h", "--idempotency-key", "rep-7", "--header", "tenant=acme",
              "--header", "x=a=b", "--version", "2", "--json", "--url", url)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "scheduled"
    info = q.get("o1")
    assert info is not None and info.envelope is not None
    env = info.envelope
    assert (env.max_attempts, env.idempotency_key, env.headers, env.version, env.result_ttl_s) \
        == (5, "rep-7", {"tenant": "acme", "x": "a=b"}, 2, 3600)
    assert info.due_at is not None and info.due_at.year == 2099
    delayed = cli("enqueue", qname, "t", "{}", "--delay", "5m", "--json", "--url", url)
    assert json.loads(delayed.stdout)["status"] == "scheduled"
    dup = cli("enqueue", qname, "report.render", "{}", "--id", "o1", "--url", url)
    assert "o1: duplicate (existing job is scheduled)" in dup.stdout
    usage = cli("enqueue", qname, "t", "{}", "--header", "novalue", "--url", url)
    assert usage.returncode == 2 and "KEY=VALUE" in usage.stderr


def test_cron_list_shows_entries_last_and_next_fire(url: str, qname: str) -> None:
    entry = Cron("cache.refresh", every=1, job_type="cache.refresh", queue=qname)

    async def run() -> None:
        async with Scheduler(url, [qname], [entry], SchedulerConfig(poll_interval_s=0.05)):
            q = Queue.from_url(url, qname)
            for _ in range(200):
                raw = json.loads(cli("cron", "list", qname, "--json", "--url", url).stdout
                                 or "[]")
                if raw and raw[0]["last"]:
                    break
                await asyncio.sleep(0.05)
            q.close()

    asyncio.run(run())
    rows = json.loads(cli("cron", "list", qname, "--json", "--url", url).stdout)
    assert [(r["name"], r["queue"], r["schedule"], r["job_type"]) for r in rows] == [
        ("cache.refresh", qname, "every 1s", "cache.refresh")]
    assert rows[0]["last"] and rows[0]["next"] and rows[0]["last_job"].startswith("cron:")
    human = cli("cron", "list", qname, "--url", url).stdout
    assert "NAME" in human and "NEXT" in human and "cache.refresh" in human


def test_producer_can_refuse_job_types_no_worker_registered(url: str, qname: str,
                                                             r: redis.Redis) -> None:
    strict = Queue.from_url(url, qname, QueueConfig(require_handler=True))
    with pytest.raises(UnknownJobType, match="no worker of this queue has published"):
        strict.enqueue("email.send")

    async def publish() -> None:
        import redis.asyncio as aredis

        client = aredis.Redis.from_url(url, protocol=2)
        await publish_types(client, [strict.keys], ["email.send", "report.render"])
        await client.aclose()

    asyncio.run(publish())
    assert set(registered_types(r, strict.keys)) == {"email.send", "report.render"}
    strict._types_at = -1e9  # the cache lasts 30 s; a test does not wait for it
    assert strict.enqueue("email.send").status == "queued"
    with pytest.raises(UnknownJobType, match=r"did you mean 'email.send'\?"):
        strict.enqueue("email.sned")
    with pytest.raises(UnknownJobType):
        strict.enqueue_many([{"type": "email.send"}, {"type": "nope"}])
    assert Queue.from_url(url, qname).enqueue("anything").status == "queued"  # opt-in only


# ----------------------------------------------------------------- the docs' error table


def _doc_errors() -> dict[str, str]:
    """operations.md's "Error messages" table: situation -> message."""
    text = (DOCS / "operations.md").read_text(encoding="utf-8")
    section = text.split("### Error messages", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| (.+?) \| `(streamq: .+?)` \|$", section, re.M)
    return dict(rows)


def _pattern(documented: str) -> str:
    """A documented line as a regex: quoted names, URLs and numbers vary."""
    out = re.escape(documented)
    out = re.sub(r"redis://[^ ]+?(?=\\ |\)|:\\ )", ".+?", out)
    out = re.sub(r"'[^']*'", "'[^']*'", out)
    out = re.sub(r"\d+", r"\\d+", out)
    out = re.sub(r"\\\{[^}]*\\\}", r"{[^}]*}", out)  # a key's hash tag
    return "^" + out.replace(r"\{", "{").replace(r"\}", "}") + "$"


def test_documented_error_lines_are_what_users_get(url: str, qname: str) -> None:
    documented = _doc_errors()
    # a name unlike every other test's queue on the shared server ("t-<hex>"), so the one
    # close match offered for its typo is this queue itself
    qname = f"errdoc-{os.urandom(4).hex()}"
    Queue.from_url(url, qname).enqueue("t", job_id="j1")
    typo = qname + "x"
    fresh = f"p{os.urandom(4).hex()}"
    cases = {
        "Redis unreachable": cli("stats", qname, "--url", "redis://127.0.0.1:1/0"),
        "wrong password or ACL user": cli("stats", qname, "--url",
                                          url.replace("redis://", "redis://ops:bad@")),
        "unknown queue (a typo, or the wrong `--prefix`)": cli("stats", typo, "--url", url),
        "`stats` without a name, and no queue is known yet": cli("stats", "--prefix", fresh,
                                                                 "--url", url),
        "bad JSON payload for `enqueue`": cli("enqueue", qname, "t", "{not json", "--url", url),
        "an invalid job id": cli("job", qname, "bad id!", "--url", url),
        "no such job": cli("job", qname, "invoice-42", "--url", url),
        "a file path where a module belongs (`streamq worker myapp/tasks.py:registry`)": cli(
            "worker", "myapp/tasks.py:registry", "--queue", qname, "--url", url),
    }
    untested = {"the ACL user may not run a command", "Redis older than 6.2",
                "a registry module that fails to import"}
    assert set(documented) == set(cases) | untested, set(documented) ^ (set(cases) | untested)
    for situation, proc in cases.items():
        line = one_error_line(proc)
        assert re.match(_pattern(documented[situation]), line), (situation, line,
                                                                 documented[situation])
