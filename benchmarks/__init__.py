"""streamq benchmarks: ``python -m benchmarks`` (full run) or ``python -m benchmarks --smoke``.

See ``docs/performance.md`` for what each workload measures and the latest results.
"""
