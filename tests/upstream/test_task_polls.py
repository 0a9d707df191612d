"""How often the gateway polls a 2026-07-28 child's own task (gatewayd/upstream/child_tasks.py `_poll_seconds`): as the
child suggests, never faster than MIN_TASK_POLL (a child suggesting 0 must not make it spin) nor slower than
MAX_TASK_POLL (a child suggesting minutes must not hold its callers that long), DEFAULT_TASK_POLL without a usable
suggestion."""

from __future__ import annotations

from typing import Any

import pytest

from gatewayd.upstream.child_tasks import DEFAULT_TASK_POLL, MAX_TASK_POLL, MIN_TASK_POLL, _poll_seconds


@pytest.mark.parametrize("suggested, seconds", [
    (250, 0.25), (0, MIN_TASK_POLL), (-5, MIN_TASK_POLL), (600_000, MAX_TASK_POLL), (1.5, MIN_TASK_POLL),
    (None, DEFAULT_TASK_POLL), ("100", DEFAULT_TASK_POLL), (True, DEFAULT_TASK_POLL),
])
def test_a_childs_suggested_poll_interval_is_kept_within_bounds(suggested: Any, seconds: float) -> None:
    task = {} if suggested is None else {"pollIntervalMs": suggested}
    assert _poll_seconds(task) == pytest.approx(seconds)
