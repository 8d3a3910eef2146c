"""Create each peer's private environment: ``.bench-venvs/<peer>`` (python3 -m venv, pinned
requirements from ``requirements/<peer>.txt``) and ``bullmq/node_modules`` (npm install).

``python -m benchmarks.peers.setup [PEER ...]``. A stamp file (a hash of the requirements) makes
re-runs free; a failed install leaves ``install-error.txt`` in the venv, reported by the harness.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VENVS = REPO / ".bench-venvs"
REQS = HERE / "requirements"
BULLMQ_DIR = HERE / "bullmq"

PY_ENVS = ("streaq", "arq", "saq", "rq", "taskiq", "dramatiq", "celery", "huey", "plot")


def venv_python(env: str) -> Path:
    return VENVS / env / "bin" / "python"


def _stamp(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_python_env(env: str, log: Callable[[str], None] = print) -> str | None:
    """Create/refresh the venv; None when ready, else the install error (also on disk)."""
    req = REQS / f"{env}.txt"
    want = _stamp(req.read_text())
    d = VENVS / env
    stamp = d / f".installed-{want}"
    if stamp.exists():
        return None
    if d.exists():
        shutil.rmtree(d)
    log(f"  installing {env} into {d} ...")
    steps = [
        ["python3", "-m", "venv", str(d)],
        [str(d / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "-r", str(req)],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            err = f"{' '.join(cmd[-3:])} failed: {(proc.stderr or proc.stdout)[-1500:]}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "install-error.txt").write_text(err)
            return err
    freeze = subprocess.run([str(d / "bin" / "python"), "-m", "pip", "freeze"],
                            capture_output=True, text=True).stdout
    (d / "freeze.txt").write_text(freeze)
    stamp.touch()
    return None


def ensure_bullmq(log: Callable[[str], None] = print) -> str | None:
    pkg = BULLMQ_DIR / "package.json"
    want = _stamp(pkg.read_text())
    stamp = BULLMQ_DIR / "node_modules" / f".installed-{want}"
    if stamp.exists():
        return None
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node/npm not on PATH"
    log("  npm install bullmq ...")
    proc = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
                          cwd=BULLMQ_DIR, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return f"npm install failed: {proc.stderr[-1500:]}"
    stamp.touch()
    return None


def installed_versions(env: str) -> str:
    f = VENVS / env / "freeze.txt"
    return f.read_text() if f.exists() else ""


def ensure_all(envs: list[str] | None = None,
               log: Callable[[str], None] = print) -> dict[str, str | None]:
    envs = list(envs or PY_ENVS) + ([] if envs else ["bullmq"])
    out: dict[str, str | None] = {}

    def one(e: str) -> tuple[str, str | None]:
        return e, (ensure_bullmq(log) if e == "bullmq" else ensure_python_env(e, log))

    with ThreadPoolExecutor(max_workers=3) as pool:
        for e, err in pool.map(one, envs):
            out[e] = err
    return out


if __name__ == "__main__":
    res = ensure_all(sys.argv[1:] or None)
    for k, v in res.items():
        print(f"{k}: {'ok' if v is None else 'FAILED ' + v}")
    sys.exit(0 if all(v is None for v in res.values()) else 1)
