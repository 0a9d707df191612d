"""A person's answer to an approval, as the daemon's HTTP APIs report it (the admin socket and the web page).

Owns the one mapping from `approvals.Answer` to a status and a JSON body: 200 when this answer decided the
approval, 409 when it could not (already finished, or the approval takes no answers from that channel),
404 when no such approval is known. Does not own deciding (approvals.py).
"""

from __future__ import annotations

from typing import Any

from gatewayd import approvals


def reported(answer: approvals.Answer) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) for an answer."""
    status = 200 if answer.ok else 404 if answer.approval is None else 409
    view = answer.approval.view() if answer.approval is not None else None
    return status, {"ok": answer.ok, "message": answer.message, "approval": view}
