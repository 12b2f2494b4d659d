"""The transport-free call path: Pipeline.handle -> Outcome, sync and updates."""
