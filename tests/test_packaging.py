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
