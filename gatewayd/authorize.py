"""Decide: the one decision for a routed call, recorded before anything runs.

Owns the order of the checks around `policy.decide` and what each outcome becomes: denied and absent
alike raise the route's "unknown" error (only a client that may call a method learns whether it
exists, and only then may the server start to say); broken argument rules raise `-32602` naming the
rule; a notification that needs a person never runs; a call that needs one comes back with its
confirmation options; a dangerous call goes on only once its decision is durably in the audit log.
The decision is made on the config generation current when it is made (the client's token was
checked when its request arrived, maybe long before), and `still_allowed` makes it again just
before the call is sent: a reload that removed the permission meanwhile stops the call. Does not
own the policy itself (policy.py) or asking the person (confirmation.py).
"""

from __future__ import annotations

from collections.abc import Callable

from gatewayd import policy
from gatewayd.calls import NOTIFICATION, Call, Target
from gatewayd.config.models import ConfirmOptions
from gatewayd.errors import ArgumentsRefused, ConfirmationDenied
from gatewayd.policy import Decision
from gatewayd.records import Records
from gatewayd.routing import unknown


async def authorize(call: Call, target: Target, records: Records, fold: bool = False) -> ConfirmOptions | None:
    """Allow the call (None), or say how a person must confirm it; raise if it may not run. With `fold`, the caller
    records the call's outcome (or `Records.unfinished`) whatever happens, and an ordinary "allow" is written in
    that outcome record rather than as a record of its own."""
    server, method = target.server, target.method
    principal = call.ctx.current_principal()
    if principal is None:
        records.decided(call, "deny", reason="the client was removed by a config reload")
        raise unknown(call)
    call.ctx.principal = principal
    verdict = policy.decide(principal, target.canonical, call.arguments,
                            confirm_required=server.needs_confirmation(method))
    if verdict.decision is Decision.DENY and not verdict.refused_arguments:
        records.decided(call, "deny", reason=verdict.reason)
        raise unknown(call)
    if not target.surface and not await server.has_tool(method):
        records.decided(call, "deny", reason="unknown")
        raise unknown(call)
    rule = verdict.rule.describe() if verdict.rule else None
    if verdict.refused_arguments:
        assert verdict.rule is not None
        records.decided(call, "deny", rule=rule, reason="arguments")
        raise ArgumentsRefused(f"{target.canonical}: argument {verdict.rule.argument!r} breaks the policy rule "
                               f"{verdict.rule.check}", {"rule": rule})
    if verdict.decision is Decision.CONFIRM:
        return await _needs_confirmation(call, target, records, verdict, rule)
    if server.is_dangerous(method):
        await records.decided_durably(call, "allow", rule=rule)
    elif fold:
        records.allowed(call, rule)
    else:
        records.decided(call, "allow", rule=rule)
    return None


def still_allowed(call: Call, target: Target, records: Records) -> Callable[[], None] | None:
    """A check, made just before the call is sent, that raises the route's "unknown" error if the client may no
    longer make it; None when nothing can have changed (no reload can reach this caller's permissions)."""
    if call.ctx.authority is None:
        return None
    decided_with = call.ctx.principal

    def check() -> None:
        principal = call.ctx.current_principal()
        if principal is decided_with:
            return  # no reload since the decision: a generation's principals never change
        allowed = principal is not None and policy.decide(
            principal, target.canonical, call.arguments, confirm_required=target.server.needs_confirmation(
                target.method)).decision is not Decision.DENY
        if not allowed:
            records.decided(call, "deny", reason="a config reload removed the permission before the call ran")
            raise unknown(call)

    return check


async def _needs_confirmation(
    call: Call, target: Target, records: Records, verdict: policy.Verdict, rule: str | None
) -> ConfirmOptions:
    if call.route == NOTIFICATION:
        # Nobody waits for a notification, so nobody could be told a person's answer: it never runs.
        records.decided(call, "deny", rule=rule, reason="needs confirmation, and a notification cannot wait")
        raise ConfirmationDenied(f"{target.canonical} needs a person's confirmation: send it as a request",
                                 {"method": target.canonical})
    await records.decided_durably(call, "confirm", rule=rule, reason=verdict.reason)
    return policy.confirm_options(call.ctx.principal, verdict, target.canonical)
