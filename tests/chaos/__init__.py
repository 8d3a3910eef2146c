"""The chaos run: workers, schedulers and a Redis server killed, frozen and cut off at random
(seeded) under a mixed load, then every accepted job checked against an execution ledger kept
outside the Redis under test.

``python -m tests.chaos --minutes M --seed S --out FILE`` (``make soak``); the bounded CI run is
``tests/chaos/test_chaos.py``. See ``docs/reliability.md``.
"""
