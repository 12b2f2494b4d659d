"""The operator's surface: check, state, CPU map, metrics, logs, systemd."""
