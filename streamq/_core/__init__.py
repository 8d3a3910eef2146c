"""The floor every other part stands on: keys, scripts, model, serialisation, connections, config,
errors, retry classes, telemetry, the embedded server."""
