"""gatewayd's tests: unit tests per module, supervision with real children, e2e against the real daemon."""
