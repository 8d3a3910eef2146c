"""The floor every other part stands on: keys, scripts, model, serialisation, connections, config,
errors, retry classes, telemetry, the embedded server, and what every part runs through: the
sans-IO op driver, the shard-count check, the queue registry and the cancel call."""
