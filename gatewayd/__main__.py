"""`python -m gatewayd` runs the daemon."""

from gatewayd.cli import gatewayd_main

if __name__ == "__main__":
    raise SystemExit(gatewayd_main())
