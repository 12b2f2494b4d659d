"""Shared pytest configuration: the containerd test bed fixtures live in tests/lab/fixtures.py."""

pytest_plugins = ["tests.lab.fixtures"]
