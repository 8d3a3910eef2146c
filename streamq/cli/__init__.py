"""The face: the ``streamq`` command (``main.py``; ``python -m streamq``), its ops commands and
the dashboard command. It sits on top of the worker, ops, the dashboard, schedulers and spark."""
