"""A process that only keeps part of a core busy: `python -m bench.burner SHARE SECONDS` (SHARE 0–1, in 10 ms
periods), for SECONDS at most.

bench.scale's streaming target runs the other calls once more beside burners that use as much CPU as the
streaming load's processes outside the daemon did, without any streams: what that load costs the other calls
merely by taking cores on a 2-core machine, against what the streams through the daemon cost them.
"""

from __future__ import annotations

import sys
import time
from typing import Final

PERIOD_S: Final = 0.01


def main(share: float, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        while time.perf_counter() - start < share * PERIOD_S:
            pass
        time.sleep((1 - share) * PERIOD_S)


if __name__ == "__main__":
    main(min(max(float(sys.argv[1]), 0.0), 1.0), float(sys.argv[2]))
