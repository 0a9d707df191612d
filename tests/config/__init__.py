"""Config tests."""
