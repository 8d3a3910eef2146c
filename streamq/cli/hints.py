"""Small courtesies of the command line: a file path given where a module is expected, a
``--limit`` over the page cap, and a reader that closed the pipe (``streamq ... | head``)."""

from __future__ import annotations

import argparse
import os
import sys

from .._ops.operations import PAGE


def module_hint(spec: str) -> str | None:
    """For ``myapp/tasks.py:registry`` (a file path where a module is expected): the
    ``module:attribute`` to write instead, else None."""
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not (module.endswith(".py") or "/" in module
                                      or os.sep in module):
        return None
    path = module[:-3] if module.endswith(".py") else module
    path = os.path.normpath(path)
    if os.path.isabs(path):
        try:
            path = os.path.relpath(path)
        except ValueError:  # another drive (Windows)
            return None
    parts = [p for p in path.replace(os.sep, "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    if parts[-1] == "__init__":
        parts.pop()
    dotted = ".".join(parts)
    if not dotted:
        return None
    return f"{dotted}:{attr or 'registry'}"


def page_limit(text: str) -> int:
    """``--limit``: a page holds 1..PAGE items; a bigger value is refused (rather than quietly
    cut to the cap), pointing at ``--cursor``."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    if n > PAGE:
        raise argparse.ArgumentTypeError(
            f"{n} is over the cap of {PAGE} per page: give --limit {PAGE} and follow the"
            " 'more: --cursor ...' line for the next page")
    return n


def quiet_broken_pipe() -> int:
    """The reader of stdout went away (``streamq ... | head``): stop quietly. Point stdout at
    /dev/null so that the interpreter's last flush cannot fail again, and return 141 (128 +
    SIGPIPE), what a command killed by the broken pipe would report."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (captured): nothing left to flush
        pass
    return 141
