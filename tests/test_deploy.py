"""The deploy recipes (deploy/, issue 30): the files parse, every ``streamq`` command and flag
they name exists (exactly, not as an abbreviation), every path and module they name exists,
and the compose services' commands come up against a private Redis and stop gracefully.
Also ``streamq health``, the check the Dockerfile's HEALTHCHECK and the probes run."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from test_reload import Lines
from yaml_subset import load_all

from streamq import Queue, QueueConfig
from streamq.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
APP_DIR = DEPLOY / "example"
"""Where the Dockerfile copies the app from (its WORKDIR /app holds the package)."""


# ------------------------------------------------------------------ reading the recipes


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    out: list[tuple[str, str]] = []
    joined = ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if not joined and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        joined += line
        word, _, rest = joined.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        joined = ""
    return out


def exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
    return value


def compose() -> dict[str, Any]:
    (doc,) = load_all((DEPLOY / "compose.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def k8s() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in load_all(path.read_text()):
            assert isinstance(doc, dict) and {"apiVersion", "kind", "metadata"} <= doc.keys()
            docs.append(doc)
    return docs


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] != "Deployment":
        return []
    found: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
    return found


def streamq_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after 'streamq') of every streamq command line the recipes hold."""
    out: list[tuple[str, list[str]]] = []
    instr = dockerfile()
    entry = [exec_form(a) for i, a in instr if i == "ENTRYPOINT"][-1]
    assert entry == ["streamq"]
    out.append(("Dockerfile CMD", [exec_form(a) for i, a in instr if i == "CMD"][-1]))
    health = [a for i, a in instr if i == "HEALTHCHECK"][-1]
    out.append(("Dockerfile HEALTHCHECK", exec_form(health.split(" CMD ", 1)[1])[1:]))
    for name, svc in compose()["services"].items():
        if svc.get("image") == "streamq-app":
            out.append((f"compose {name}", svc["command"]))
        test = svc.get("healthcheck", {}).get("test")
        if test and test[1] == "streamq":
            out.append((f"compose {name} healthcheck", test[2:]))
    for doc in k8s():
        for c in containers(doc):
            out.append((f"k8s {doc['metadata']['name']}", c["args"]))
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                cmd = c.get(probe, {}).get("exec", {}).get("command")
                if cmd:
                    assert cmd[0] == "streamq"
                    out.append((f"k8s {doc['metadata']['name']} {probe}", cmd[1:]))
    return out


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


METRIC = re.compile(r"\bstreamq_[a-z_]+")


def grafana() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DEPLOY / "grafana" / "streamq.json").read_text())
    return doc


def grafana_queries() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' and its variables'."""
    out = [t["expr"] for p in grafana()["panels"] for t in p.get("targets", [])]
    out.extend(v["definition"] for v in grafana()["templating"]["list"])
    return out


def keda_queries() -> list[str]:
    return [t["metadata"]["query"] for d in k8s() if d["kind"] == "ScaledObject"
            for t in d["spec"]["triggers"]]


def metric_names_used() -> set[str]:
    """Every metric name the Grafana dashboard and the KEDA ScaledObject query (a test in
    test_metrics.py checks them against a real scrape)."""
    return {n for q in [*grafana_queries(), *keda_queries()] for n in METRIC.findall(q)}


# ------------------------------------------------------------------ the files


def test_the_dockerfile_is_multi_stage_non_root_with_a_health_check() -> None:
    instr = dockerfile()
    froms = [a for i, a in instr if i == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith(" AS build")
    last = max(n for n, (i, _) in enumerate(instr) if i == "FROM")
    copies_from_build = [a for i, a in instr[last:] if i == "COPY" and "--from=build" in a]
    assert copies_from_build, "the run stage takes the build stage's virtualenv"
    users = [a for i, a in instr[last:] if i == "USER"]
    assert users and users[-1] not in ("root", "0")
    health = [a for i, a in instr if i == "HEALTHCHECK"]
    assert len(health) == 1 and '"streamq", "health"' in health[0]


def test_compose_has_redis_with_aof_a_worker_the_scheduler_and_the_dashboard() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "worker", "scheduler", "dashboard"}
    redis_cmd = services["redis"]["command"]
    assert option(redis_cmd, "--appendonly") == "yes"
    assert "redis-data:/data" in services["redis"]["volumes"]
    worker = services["worker"]
    assert worker["command"][0] == "worker"
    assert worker["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (DEPLOY / worker["build"]["context"] / worker["build"]["dockerfile"]).is_file()
    # docker stop waits longer than the worker's graceful stop before it kills
    stop_s = int(worker["stop_grace_period"].removesuffix("s"))
    assert stop_s > float(option(worker["command"], "--grace-period"))
    assert services["scheduler"]["command"][0] == "scheduler"
    assert services["dashboard"]["command"][0] == "dashboard"
    for name in ("worker", "scheduler", "dashboard"):
        assert services[name]["environment"]["STREAMQ_URL"].startswith("redis://redis:")


def test_the_k8s_worker_waits_longer_than_its_grace_period() -> None:
    docs = {d["metadata"]["name"]: d for d in k8s() if d["kind"] == "Deployment"}
    assert {"streamq-worker", "streamq-scheduler", "streamq-dashboard"} <= docs.keys()
    for name in ("streamq-worker", "streamq-scheduler", "streamq-dashboard"):
        spec = docs[name]["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert docs[name]["spec"]["selector"]["matchLabels"] == \
            docs[name]["spec"]["template"]["metadata"]["labels"]
    worker = docs["streamq-worker"]["spec"]["template"]["spec"]
    (c,) = worker["containers"]
    assert c["args"][0] == "worker"
    assert worker["terminationGracePeriodSeconds"] > float(option(c["args"], "--grace-period"))
    assert c["livenessProbe"]["exec"]["command"][:2] == ["streamq", "health"]
    # the pods run as the image's user
    uid = re.search(r"useradd .*--uid (\d+)", (DEPLOY / "Dockerfile").read_text())
    assert uid is not None and worker["securityContext"]["runAsUser"] == int(uid[1])
    # the secret every container reads the URL from exists in the recipes
    secret = [d for d in k8s() if d["kind"] == "Secret"]
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for d in k8s() for c in containers(d)
            for e in c["env"]}
    assert refs == {s["metadata"]["name"] for s in secret}


def test_the_keda_scaled_object_scales_the_worker_to_zero_and_back() -> None:
    (scaled,) = [d for d in k8s() if d["kind"] == "ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    deployments = {d["metadata"]["name"]: d for d in k8s() if d["kind"] == "Deployment"}
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == "streamq-worker" in deployments
    assert spec["minReplicaCount"] == 0 and spec["maxReplicaCount"] > 1
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    # any job at all wakes a worker (activation is "above the threshold"); an empty answer
    # from Prometheus is an error (then the fallback), never a 0 that scales to zero
    assert float(meta["activationThreshold"]) == 0 and float(meta["threshold"]) > 0
    assert meta["ignoreNullValues"] == "false" and spec["fallback"]["replicas"] >= 1
    assert METRIC.findall(meta["query"]) == ["streamq_queue_backlog"]
    assert meta["query"].startswith("max(")  # every process reports the same value
    # the backlog is reported while no worker runs: the scheduler serves it, scraped
    for name in ("streamq-worker", "streamq-scheduler"):
        template = deployments[name]["spec"]["template"]
        (c,) = template["spec"]["containers"]
        port = option(c["args"], "--metrics-port")
        assert option(c["args"], "--metrics-host") == "0.0.0.0"
        assert template["metadata"]["annotations"]["prometheus.io/port"] == port
        assert [p["containerPort"] for p in c["ports"]] == [int(port)]


def test_the_grafana_dashboard_parses_and_queries_streamq_metrics() -> None:
    doc = grafana()
    assert doc["uid"] and doc["__inputs"][0]["pluginId"] == "prometheus"
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert len(panels) >= 8
    for p in panels:
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}" and p["targets"], p["title"]
        for t in p["targets"]:
            assert METRIC.search(t["expr"]), (p["title"], t["expr"])
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
    used = metric_names_used()
    assert {"streamq_queue_backlog", "streamq_queue_saturation",
            "streamq_jobs_completed_total", "streamq_job_duration_seconds_bucket"} <= used
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("text", ["a: 'single'", "a: |\n  block", "a: *nothing",
                                  "a:\n\tb: 1", "a: [1, 2", "a: 1\na: 2"])
def test_the_yaml_subset_refuses_what_it_does_not_read(text: str) -> None:
    with pytest.raises((ValueError, KeyError)):
        load_all(text)


def _subparser(command: str) -> Any:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    choices: dict[str, Any] = sub.choices  # type: ignore[assignment]
    return choices[command]


def test_every_streamq_command_and_flag_in_the_recipes_exists() -> None:
    found = streamq_commands()
    assert len(found) >= 8
    for where, argv in found:
        sub = _subparser(argv[0])
        for token in argv[1:]:
            if token.startswith("--"):  # spelled out in full, not an abbreviation
                assert token.split("=")[0] in sub._option_string_actions, (where, token)
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"{where}: streamq {shlex.join(argv)} is refused") from exc
        assert args.command == argv[0]


def test_every_path_and_module_in_the_recipes_exists() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for instr, rest in dockerfile():
        if instr == "COPY" and "--from=" not in rest:
            *sources, _dest = [w for w in rest.split() if not w.startswith("--")]
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: no such path in the repository"
                assert f"!{src.rstrip('/')}" in ignore, f"COPY {src}: not in the context"
    specs = {t for _, argv in streamq_commands() for t in argv if re.fullmatch(
        r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", t)}
    assert specs == {"myapp.tasks:registry", "myapp.cron:CRON"}
    code = ("import sys; from streamq.cli.main import load_registry, _load_cron;"
            " load_registry('myapp.tasks:registry'); print(len(_load_cron('myapp.cron:CRON')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=APP_DIR, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr
    extras = re.search(r'pip install "\.\[([\w,]+)\]"', (DEPLOY / "Dockerfile").read_text())
    assert extras is not None
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in extras[1].split(","):
        assert re.search(rf"^{extra} = \[", pyproject, re.M), extra


# ------------------------------------------------------------------ running the services


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def local(argv: list[str], prefix: str) -> list[str]:
    """The service's command for this machine: loopback, free ports, a private key prefix."""
    out = list(argv)
    for flag, value in (("--metrics-port", "0"), ("--port", str(free_port())),
                        ("--host", "127.0.0.1"), ("--metrics-host", "127.0.0.1")):
        if flag in out:
            out[out.index(flag) + 1] = value
    return [*out, "--prefix", prefix]


def run_streamq(argv: list[str], url: str, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "STREAMQ_URL": url, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "streamq", *argv], cwd=APP_DIR, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def health(argv: list[str], url: str) -> tuple[int, str]:
    proc = run_streamq(argv, url)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


def test_the_compose_services_come_up_and_stop_gracefully(url: str) -> None:
    services = compose()["services"]
    prefix = f"deploy-{uuid.uuid4().hex[:8]}"
    procs: dict[str, tuple[subprocess.Popen[str], Lines]] = {}
    try:
        argvs = {name: local(services[name]["command"], prefix)
                 for name in ("worker", "scheduler", "dashboard")}
        for name, argv in argvs.items():
            proc = run_streamq(argv, url)
            procs[name] = (proc, Lines(proc))
        # the worker: its own health check passes (2 processes, as --processes 2)
        check = local(services["worker"]["healthcheck"]["test"][2:], prefix)
        wait_until(lambda: health(check, url)[0] == 0, timeout_s=60,
                   what="the worker's health check to pass")
        # the scheduler promotes (the worker runs --no-promote), the worker runs the job
        procs["scheduler"][1].wait_for("started on")
        q = Queue.from_url(url, "jobs", QueueConfig(key_prefix=prefix))
        job = q.enqueue("greet", "world", delay=0.2)
        assert q.result(job.job_id, timeout=30) == "hello world"
        # the dashboard answers
        port = option(argvs["dashboard"], "--port")

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(answers, timeout_s=30, what="the dashboard to answer")
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[str, int] = {}
        for name, (proc, _) in procs.items():
            try:
                codes[name] = proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = -9
    # (uvicorn raises the signal again after its graceful shutdown: status 143 says SIGTERM)
    codes["dashboard"] = 0 if codes["dashboard"] == -signal.SIGTERM else codes["dashboard"]
    for name, (_, lines) in procs.items():
        lines.count("")
        assert codes[name] == 0, f"{name}:\n{''.join(lines.seen)}"
    lines = procs["worker"][1]
    lines.wait_for("stopped:", n=2)  # both worker processes stopped gracefully


# ------------------------------------------------------------------ streamq health


def test_health_passes_only_while_a_worker_of_this_host_beats(url: str, qname: str) -> None:
    base = ["health", "--queue", qname]
    rc, out = health(base, url)
    assert rc == 1 and out.startswith(f"unhealthy: 0 live worker(s) of '{qname}' on host"), out
    worker = run_streamq(["worker", "myapp.tasks:registry", "--queue", qname], url)
    lines = Lines(worker)
    try:
        lines.wait_for("started on")
        wait_until(lambda: health(base, url)[0] == 0, timeout_s=30, what="a healthy worker")
        rc, out = health([*base, "--json"], url)
        report = json.loads(out)
        assert rc == 0 and report["healthy"] is True and report["host"] == socket.gethostname()
        assert report["queues"][0]["workers"] == 1
        rc, out = health([*base, "--min-workers", "2"], url)  # one is not enough
        assert rc == 1 and "at least 2 wanted" in out, out
        rc, out = health([*base, "--host", "elsewhere"], url)  # not this host's worker
        assert rc == 1, out
        rc, out = health([*base, "--host", "elsewhere", "--any-host"], url)
        assert rc == 0, out
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, "".join(lines.seen)


@pytest.mark.parametrize("argv", [["--max-age", "0"], ["--min-workers", "0"]])
def test_health_refuses_bad_limits(url: str, argv: list[str]) -> None:
    rc, out = health(["health", "--queue", "q", *argv], url)
    assert rc == 1 and "--max-age must be more than 0" in out, out
