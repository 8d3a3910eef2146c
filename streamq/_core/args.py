"""Checks of arguments that are easy to get wrong, refused where they are written."""

from __future__ import annotations

from typing import Any

from .errors import InvalidArgument


def check_queue_list(queues: Any, where: str = "Worker") -> None:
    """A list of queue names, not one name: ``Worker(url, "emails", ...)`` would otherwise
    iterate the string and serve the queues ``e``, ``m``, ``a``, ``i``, ``l``, ``s``."""
    if isinstance(queues, str | bytes):
        raise InvalidArgument(
            f"{where} takes a list of queue names, got the string {queues!r}:"
            f" write {where}(url, [{queues!r}], registry)")
    if not hasattr(queues, "__iter__"):
        raise InvalidArgument(
            f"{where} takes a list of queue names, got {type(queues).__name__} {queues!r}")
