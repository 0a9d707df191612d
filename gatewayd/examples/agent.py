"""A small ACP agent over stdio (standard library only): ``python3 -m gatewayd.examples.agent``.

Owns a notebook per session, kept across the turns of a conversation, and what it does with each prompt:

    note TEXT     keeps TEXT
    notes         says every note, one a line
    read PATH     reads a text file through its client (``fs/read_text_file``) and says how long it is
    forget        asks its client's permission (``session/request_permission``), then forgets every note
    anything else says what it understands

It streams what it says as ``session/update`` agent message chunks and ends each turn with
``stopReason: end_turn``. While it waits for its client's answer it keeps reading, so a
``session/cancel`` still reaches it. Framing comes from ``_mcpstdio``'s stdout channel.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections import deque
from typing import Any, Final

from gatewayd.examples._mcpstdio import Channel, log_stderr

PROTOCOL_VERSION: Final = 1
HELP: Final = "I understand: note TEXT, notes, read PATH, forget."


class Agent:
    """The notebook agent: one JSON-RPC line at a time from stdin, its answers and requests on `out`."""

    def __init__(self, out: Channel) -> None:
        self.out = out
        self.notebooks: dict[str, list[str]] = {}
        self.ids = itertools.count(1)
        # Messages read while waiting for an answer to one of the agent's own requests, handled after it.
        self.later: deque[dict[str, Any]] = deque()
        self.cancelled: set[str] = set()

    def run(self) -> None:
        while True:
            message = self.later.popleft() if self.later else self.read()
            if message is None:
                return
            self.handle(message)

    def read(self) -> dict[str, Any] | None:
        for line in sys.stdin:
            try:
                message = json.loads(line)
            except ValueError:
                log_stderr("agent: a line that is not JSON, dropped")
                continue
            if isinstance(message, dict):
                return message
        return None

    def send(self, message: dict[str, Any]) -> None:
        self.out.send({"jsonrpc": "2.0", **message})

    def handle(self, message: dict[str, Any]) -> None:
        method, params, request_id = message.get("method"), message.get("params") or {}, message.get("id")
        if method == "session/cancel":
            self.cancelled.add(str(params.get("sessionId")))
            return
        if request_id is None:
            return
        try:
            result = self.answer(str(method), params)
        except KeyError as exc:
            self.send({"id": request_id, "error": {"code": -32602, "message": f"unknown session {exc}"}})
            return
        if result is None:
            self.send({"id": request_id, "error": {"code": -32601, "message": f"no method {method}"}})
        else:
            self.send({"id": request_id, "result": result})

    def answer(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        if method == "initialize":
            return {"protocolVersion": PROTOCOL_VERSION, "agentCapabilities": {"loadSession": False},
                    "agentInfo": {"name": "gatewayd-notebook", "version": "1"}, "authMethods": []}
        if method == "session/new":
            session = f"notebook-{os.getpid()}-{len(self.notebooks) + 1}"
            self.notebooks[session] = []
            return {"sessionId": session}
        if method == "session/prompt":
            return self.prompt(str(params.get("sessionId")), params.get("prompt") or [])
        return None

    def prompt(self, session: str, blocks: list[Any]) -> dict[str, Any]:
        notes = self.notebooks[session]
        self.cancelled.discard(session)
        text = " ".join(block.get("text", "") for block in blocks if isinstance(block, dict)).strip()
        command, _, rest = text.partition(" ")
        if command == "note" and rest:
            notes.append(rest)
            self.say(session, f"Noted ({len(notes)} so far).")
        elif command == "notes":
            self.say(session, "\n".join(notes) if notes else "No notes yet.")
        elif command == "read" and rest:
            answer = self.ask("fs/read_text_file", {"sessionId": session, "path": rest})
            if "result" in answer:
                content = str(answer["result"].get("content", ""))
                self.say(session, f"{rest}: {len(content.splitlines())} lines, {len(content)} characters.")
            else:
                self.say(session, f"I could not read {rest}: {answer.get('error', {}).get('message')}")
        elif command == "forget":
            self.forget(session, notes)
        else:
            self.say(session, HELP)
        stop = "cancelled" if session in self.cancelled else "end_turn"
        return {"stopReason": stop}

    def forget(self, session: str, notes: list[str]) -> None:
        answer = self.ask("session/request_permission", {
            "sessionId": session,
            "toolCall": {"toolCallId": "forget", "title": f"Forget {len(notes)} notes", "kind": "delete"},
            "options": [{"optionId": "yes", "name": "Forget them", "kind": "allow_once"},
                        {"optionId": "no", "name": "Keep them", "kind": "reject_once"}],
        })
        outcome = answer.get("result", {}).get("outcome", {})
        if outcome.get("optionId") == "yes":
            notes.clear()
            self.say(session, "Forgotten.")
        else:
            self.say(session, "Kept them.")

    def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request to the client and wait for its answer, keeping whatever else arrives for later."""
        request_id = f"agent-{next(self.ids)}"
        self.send({"id": request_id, "method": method, "params": params})
        while (message := self.read()) is not None:
            if message.get("id") == request_id and "method" not in message:
                return message
            if message.get("method") == "session/cancel":
                self.handle(message)
            else:
                self.later.append(message)
        return {"error": {"message": "the client went away"}}

    def say(self, session: str, text: str) -> None:
        self.send({"method": "session/update", "params": {"sessionId": session, "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}})


def main() -> None:
    Agent(Channel()).run()


if __name__ == "__main__":
    main()
