"""Supervision tests with real child processes."""
