"""The face: the ``streamq`` command (``main.py``; ``python -m streamq``), its ops commands, the
dashboard command and the demo (``streamq demo [--web]``). It sits on top of the worker, ops,
the dashboard, schedulers and spark; nothing below imports it."""
