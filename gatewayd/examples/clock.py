"""Minimal MCP stdio server with two tools, ``now`` and ``countdown``: ``python3 -m gatewayd.examples.clock``.

Owns the clock tools: current time in a named zone, and a cancellable one-second-per-step countdown that
reports progress. The MCP handshake, dispatch and cancellation bookkeeping come from ``_mcpstdio``.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, tzinfo
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gatewayd.examples._mcpstdio import (
    CallContext,
    JsonObject,
    McpServer,
    Tool,
    ToolArgumentError,
    check_known_arguments,
    optional_string,
    require_int,
    text_result,
)

SERVER_NAME: Final = "gatewayd-clock"
SERVER_VERSION: Final = "0.1.0"
DEFAULT_TIMEZONE: Final = "UTC"
COUNTDOWN_MIN_SECONDS: Final = 1
COUNTDOWN_MAX_SECONDS: Final = 30
COUNTDOWN_STEP_SECONDS: Final = 1.0

NOW_INPUT_SCHEMA: Final[JsonObject] = {
    "type": "object",
    "properties": {
        "timezone": {
            "type": "string",
            "description": 'IANA time zone name such as "Europe/Paris"; default "UTC"',
        },
    },
    "additionalProperties": False,
}

COUNTDOWN_INPUT_SCHEMA: Final[JsonObject] = {
    "type": "object",
    "properties": {
        "seconds": {
            "type": "integer",
            "minimum": COUNTDOWN_MIN_SECONDS,
            "maximum": COUNTDOWN_MAX_SECONDS,
            "description": "How many seconds to count down; one progress notification per second",
        },
    },
    "required": ["seconds"],
    "additionalProperties": False,
}


def resolve_zone(name: str) -> tzinfo:
    if name == DEFAULT_TIMEZONE:
        return UTC  # needs no tz database, which minimal hosts may lack
    try:
        return ZoneInfo(name)
    # ValueError: malformed keys such as absolute paths; OSError: unreadable tz files.
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ToolArgumentError(f"Unknown timezone: {name}") from None


def now_tool(arguments: JsonObject, _context: CallContext) -> JsonObject:
    check_known_arguments(arguments, NOW_INPUT_SCHEMA["properties"])
    name = optional_string(arguments, "timezone")
    if name is None:
        name = DEFAULT_TIMEZONE
    iso = datetime.now(resolve_zone(name)).isoformat()
    return text_result(iso, structured={"iso": iso, "timezone": name})


def countdown_tool(arguments: JsonObject, context: CallContext) -> JsonObject:
    check_known_arguments(arguments, COUNTDOWN_INPUT_SCHEMA["properties"])
    seconds = require_int(arguments, "seconds", COUNTDOWN_MIN_SECONDS, COUNTDOWN_MAX_SECONDS)
    start = time.monotonic()
    for step in range(1, seconds + 1):
        # Waiting against absolute targets keeps the steps from drifting; the event ends it early on cancel.
        remaining = start + step * COUNTDOWN_STEP_SECONDS - time.monotonic()
        if context.cancelled.wait(max(0.0, remaining)):
            return text_result("cancelled", is_error=True)  # never sent: cancelled calls get no response
        context.report_progress(step, seconds, f"{step}/{seconds}")
    return text_result("done")


TOOLS: Final = (
    Tool(
        name="now",
        description="Current time as ISO-8601 in the given IANA time zone (default UTC).",
        input_schema=NOW_INPUT_SCHEMA,
        handler=now_tool,
        annotations={"readOnlyHint": True},
    ),
    Tool(
        name="countdown",
        description="Count down 1-30 seconds, reporting progress each second, then say done.",
        input_schema=COUNTDOWN_INPUT_SCHEMA,
        handler=countdown_tool,
        annotations={"readOnlyHint": True},
        blocking=True,
    ),
)


def main() -> int:
    return McpServer(SERVER_NAME, SERVER_VERSION, TOOLS).serve()


if __name__ == "__main__":
    sys.exit(main())
