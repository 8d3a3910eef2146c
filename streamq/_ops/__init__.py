"""Admin operations (sans-IO), the CLI, the demo and the metrics exporter."""
