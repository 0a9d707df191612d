"""End-to-end tests: the real daemon as a subprocess, called over HTTP."""
