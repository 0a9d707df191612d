"""The streaming target's streams, in a process of their own: `python -m bench.streams URL TOKEN SESSION COUNT`.

bench.scale's `streaming` target times other calls while 100 calls stream 10,000 progress notifications a second.
Parsing those events in the same process as the timed calls made the timer itself late (one event loop, two cores,
busy with the streams), so the other calls' p99 measured the load client as much as the daemon. This process opens
the streams in the given MCP session, prints `ready` once every stream's answer has begun, then one JSON line: per
stream, how many notifications came, their latencies (ms, from the wall time the child wrote into each), and
whether its result came.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, Final

import aiohttp

from bench import wire

STREAM_RATE: Final = 100  # progress notifications a second, each stream
STREAM_SECONDS: Final = 10.0
# A stream is given this many times its length before it counts as failed.
STREAM_DEADLINE_FACTOR: Final = 6


async def _stream(http: aiohttp.ClientSession, url: str, headers: dict[str, str], token: int,
                  started: asyncio.Queue[int]) -> dict[str, Any]:
    count = int(STREAM_RATE * STREAM_SECONDS)
    body = wire.compact(wire.request("tools/call", {
        "name": "prog__stream", "arguments": {"count": count, "interval": 1 / STREAM_RATE},
        "_meta": {"progressToken": token}}, request_id=token))
    latencies: list[float] = []
    done = False
    async with http.post(url, data=body, headers=headers,
                         timeout=aiohttp.ClientTimeout(total=STREAM_SECONDS * STREAM_DEADLINE_FACTOR)) as response:
        started.put_nowait(token)
        rest = b""
        # Chunks as they come, cut into lines here: a line at a time through aiohttp's reader cost this process an
        # await per line, three lines an event, on the cores the daemon under test shares.
        async for chunk in response.content.iter_any():
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for raw in lines:
                if not raw.startswith(b"data: "):
                    continue
                message = json.loads(raw[6:])
                if message.get("method") == "notifications/progress":
                    latencies.append((time.time() - float(message["params"]["message"])) * 1000)
                elif message.get("id") == token:
                    done = "result" in message
    return {"received": len(latencies), "latencies": latencies, "done": done}


async def main(url: str, token: str, session: str, count: int) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": wire.ACCEPT_SSE,
               wire.SESSION_HEADER: session, wire.VERSION_HEADER: wire.MCP_PROTOCOL_VERSION}
    started: asyncio.Queue[int] = asyncio.Queue()
    connector = aiohttp.TCPConnector(limit=count + 1, limit_per_host=count + 1)
    async with aiohttp.ClientSession(connector=connector) as http:
        streams = asyncio.gather(*(_stream(http, url, headers, index + 1, started) for index in range(count)))
        async with asyncio.timeout(STREAM_SECONDS):
            for _ in range(count):
                await started.get()
        print("ready", flush=True)
        results = await streams
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
