# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""Imported first by every adapter: puts benchmarks/peers on sys.path (for ``common``)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
