"""`crihook replay`: recorded calls through the real pipeline, diffs."""
