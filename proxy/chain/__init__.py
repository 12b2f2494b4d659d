"""Hooks as a chain: order, permissions, merging, in-process and plugin hooks."""
