"""Tests of the HTTP layer, in-process."""
