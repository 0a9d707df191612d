"""Declarative config: strict models, the loader that turns directories into a Snapshot, and diffs."""
