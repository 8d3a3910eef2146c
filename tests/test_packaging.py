"""pyproject.toml: what setuptools would warn about at install, and the extras in the README."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_license_is_an_spdx_expression() -> None:
    """A `license = { text = ... }` table is deprecated (a warning at every build since
    setuptools 77, an error from 2027)."""
    cfg = _pyproject()
    assert isinstance(cfg["project"]["license"], str)
    assert any(r.startswith("setuptools>=") and int(r.split(">=")[1].split(".")[0]) >= 77
               for r in cfg["build-system"]["requires"])


def test_every_folder_that_ships_is_a_listed_package() -> None:
    """setuptools warns ("Package would be ignored") about an importable folder left out of
    `packages`, such as one holding only data files (templates, Lua)."""
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = set()
    for top in ("streamq", "schedulers"):
        for folder in [ROOT / top, *(ROOT / top).rglob("*")]:
            if (folder.is_dir() and folder.name != "__pycache__"
                    and any(f.is_file() for f in folder.iterdir())):
                found.add(".".join(folder.relative_to(ROOT).parts))
    assert found == listed


def test_the_readme_names_every_extra() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    extras = set(_pyproject()["project"]["optional-dependencies"]) - {"dev"}
    missing = sorted(e for e in extras if f"streamq[{e}]" not in readme)
    assert not missing, f"README.md does not name the extras {missing}"


def test_the_console_script_names_a_function_that_exists() -> None:
    """`[project.scripts]` is read at install: a module moved without it breaks `streamq`."""
    import importlib

    target = _pyproject()["project"]["scripts"]["streamq"]
    module, _, attr = target.partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    main_py = (ROOT / "streamq" / "__main__.py").read_text(encoding="utf-8")
    assert f"from {module.removeprefix('streamq')} import {attr}" in main_py


def _make_n(venv: Path, target: str) -> str:
    """What ``make TARGET`` would run with the virtualenv at ``venv`` (``make -n``)."""
    import subprocess

    done = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={venv}"],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_make_demo_installs_the_dashboard_extra_and_make_test_the_rest(tmp_path: Path) -> None:
    """`make demo` installs only the package and the dashboard extra; `make test` (and the
    targets like it) the dev extra; a dev install counts for the demo, never the reverse."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        raise AssertionError("make is needed on PATH (the README's first commands use it)")
    venv = tmp_path / "venv"
    fresh = _make_n(venv, "demo")
    assert "-m venv" in fresh and "-e '.[dashboard]'" in fresh and "[dev]" not in fresh
    assert f"{venv}/bin/streamq demo" in fresh
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "bin" / "python").chmod(0o755)
    checksum = subprocess.run(["cksum", "pyproject.toml"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.split()[0]
    (venv / f".installed-demo-{checksum}").touch()  # after `make demo`
    assert "pip" not in _make_n(venv, "demo")
    to_test = _make_n(venv, "test-fast")
    assert "-e '.[dev]'" in to_test and "-m venv" not in to_test
    (venv / f".installed-dev-{checksum}").touch()  # after `make test`
    for target in ("demo", "test-fast", "lint"):
        assert "pip" not in _make_n(venv, target), target
    stale = venv / ".installed-dev-1"  # pyproject.toml changed since: both levels again
    (venv / f".installed-dev-{checksum}").rename(stale)
    (venv / f".installed-demo-{checksum}").unlink()
    assert "-e '.[dashboard]'" in _make_n(venv, "demo")
    assert "-e '.[dev]'" in _make_n(venv, "test-fast")


def test_the_floor_leg_pins_the_lowest_version_of_every_dependency() -> None:
    """`make test-floor` (CI) installs .ci/floor-requirements.txt: a floor raised or lowered
    in pyproject.toml without it would be declared, not tested. Each dependency of the package
    and of the dashboard, metrics and msgpack extras is pinned there at a version its specifier
    allows, in the same release series as the floor (`>=6.2` is tested at 6.2.x, not at 8.1)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    pins: dict[str, Version] = {}
    for line in (ROOT / ".ci" / "floor-requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = Version(version.strip())
    cfg = _pyproject()["project"]
    extras = cfg["optional-dependencies"]
    for spec in [*cfg["dependencies"], *extras["dashboard"], *extras["metrics"],
                 *extras["msgpack"]]:
        req = Requirement(spec)
        name = req.name.lower()
        assert name in pins, f"{name} has no pin in .ci/floor-requirements.txt"
        assert pins[name] in req.specifier, f"{name}=={pins[name]} is outside {req.specifier}"
        [floor] = [Version(s.version) for s in req.specifier if s.operator == ">="]
        assert pins[name].release[:2] == floor.release[:2], f"{name}: {pins[name]} vs {floor}"
