"""The web approval page for operators: a live list of pending confirmations with approve/deny.

Owns the page (one static, self-contained HTML document with its inline CSS and JS, served under a
strict Content-Security-Policy), its JSON API (`/approvals/api/...`: the pending list, the live
event stream, approve and deny) and ending those streams when the daemon stops. Every API route
needs an operator token (`Authorization: Bearer`); agents' tokens are refused by TokenTable.operator.
The page holds no data itself, so loading it needs no token; the browser keeps the token in
sessionStorage and reads the stream with fetch(), since EventSource cannot send a header.
Does not own the approvals themselves (approvals.py), tokens (auth.py), or Host/Origin checks and
turning HttpError into a response (app.py).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gatewayd import approvals, jsonrpc
from gatewayd.errors import HttpError
from gatewayd.web import sse
from gatewayd.web.mcp_http import STATE

logger = logging.getLogger(__name__)

PAGE_PATH = "/approvals"
API_PATH = f"{PAGE_PATH}/api"

# What the page offers for "allow the same call again without asking": (seconds, label); 0 asks every time.
ALLOW_AGAIN_CHOICES = [(0, "no, ask every time"), (600, "for 10 minutes"), (3600, "for 1 hour")]
# {"reason": <500 characters>} fits in this many times over; a bigger body is not a decision.
MAX_DECISION_BODY_BYTES = 8192
# Each open page holds a watcher queue; a handful of operators needs a few, a runaway script must not hold more.
MAX_STREAMS = 64
# A page that cannot take a few kilobytes in this long is gone or stuck; stop holding its watcher.
WRITE_TIMEOUT = 10.0
# What a refused stream (too many pages, or stopping) is told to wait before trying again.
RETRY_AFTER_S = 5

SNAPSHOT = "snapshot"
CHANGE = "change"


# -- the page --------------------------------------------------------------------------------------------

_STYLE = """
:root { color-scheme: light dark; --bg: #f4f5f7; --card: #fff; --fg: #1c1e21; --muted: #5b616b;
  --line: #d5d9e0; --ok: #176b2c; --ok-bg: #e3f4e7; --bad: #a4161a; --bad-bg: #fbe6e6; --warn: #8a5a00;
  --warn-bg: #fff4d6; --accent: #1f5fbf; --code: #f0f2f5; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #15171a; --card: #1f2226; --fg: #e8eaed; --muted: #a3a9b2; --line: #3a3f46; --ok: #7fd18f;
    --ok-bg: #173321; --bad: #ff8a8a; --bad-bg: #3d1b1c; --warn: #f2c35b; --warn-bg: #3a2f12;
    --accent: #8ab4f8; --code: #16181b; }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg); line-height: 1.45;
  font: 16px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
.bar { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: center; padding: .75rem 1rem;
  background: var(--card); border-bottom: 1px solid var(--line); position: sticky; top: 0; z-index: 1; }
.bar h1 { font-size: 1.15rem; margin: 0; flex: 1 1 auto; }
main { max-width: 60rem; margin: 0 auto; padding: 1rem; }
h2 { font-size: 1.1rem; margin: 1.25rem 0 .5rem; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 1rem; }
.status { margin: 0; padding: .2rem .65rem; border-radius: 999px; font-size: .9rem; font-weight: 600;
  background: var(--code); color: var(--muted); }
.status[data-state="live"] { background: var(--ok-bg); color: var(--ok); }
.status[data-state="retrying"], .status[data-state="connecting"] { background: var(--warn-bg); color: var(--warn); }
.status[data-state="refused"] { background: var(--bad-bg); color: var(--bad); }
label { display: block; font-weight: 600; margin: .75rem 0 .25rem; }
input[type=password], input[type=text], select { width: 100%; font: inherit; padding: .55rem .6rem; border-radius: 6px;
  border: 1px solid var(--line); background: var(--bg); color: var(--fg); }
button { font: inherit; font-weight: 600; min-height: 44px; padding: .5rem 1.1rem; border-radius: 8px;
  border: 1px solid var(--line); background: var(--card); color: var(--fg); cursor: pointer; }
button:disabled { opacity: .55; cursor: not-allowed; }
:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
.primary { background: var(--accent); border-color: var(--accent); color: var(--card); margin-top: .75rem; }
.approve { background: var(--ok); border-color: var(--ok); color: var(--card); }
.deny { background: var(--bad); border-color: var(--bad); color: var(--card); }
.quiet { min-height: 36px; padding: .3rem .8rem; font-weight: 500; }
.error { color: var(--bad); font-weight: 600; margin: .5rem 0 0; }
.error:empty, .message:empty { display: none; }
.hint, .count { color: var(--muted); margin: .25rem 0 .75rem; }
.warning { background: var(--warn-bg); color: var(--warn); padding: .5rem .75rem; border-radius: 6px; }
.list, .recent { list-style: none; margin: 0; padding: 0; }
.approval { background: var(--card); border: 1px solid var(--line); border-left: 6px solid var(--accent);
  border-radius: 10px; padding: 1rem; margin: 0 0 1rem; }
.approval.urgent { border-left-color: var(--bad); }
.approval.finished { border-left-color: var(--muted); opacity: .8; }
.approval h3 { margin: 0; font-size: 1.15rem; word-break: break-all; }
.approval h3 .from { font-weight: 400; color: var(--muted); }
.timer { margin: .25rem 0 .5rem; font-weight: 600; }
.urgent .timer { color: var(--bad); }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: .15rem .75rem; margin: .5rem 0; }
.facts dt { color: var(--muted); }
.facts dd { margin: 0; word-break: break-all; font-family: ui-monospace, SFMono-Regular, Menlo, monospace;
  font-size: .9rem; }
.arguments { background: var(--code); border: 1px solid var(--line); border-radius: 6px; padding: .6rem;
  margin: .25rem 0 .75rem; max-height: 60vh; overflow: auto; white-space: pre-wrap; overflow-wrap: anywhere;
  font: .9rem/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
.buttons { display: flex; flex-wrap: wrap; gap: .75rem; margin-top: .75rem; }
.buttons button { flex: 1 1 10rem; }
.message { margin: .75rem 0 0; padding: .5rem .75rem; border-radius: 6px; background: var(--code); }
.message.ok { background: var(--ok-bg); color: var(--ok); }
.message.bad { background: var(--bad-bg); color: var(--bad); }
.outcome { font-weight: 600; margin: .5rem 0 0; }
.approval[data-state="approved"] .outcome { color: var(--ok); }
.approval[data-state="denied"] .outcome { color: var(--bad); }
.recent:empty::before { content: "Nothing has finished since this page was opened."; color: var(--muted); }
.recent li { border-bottom: 1px solid var(--line); padding: .4rem 0; font-size: .95rem; overflow-wrap: anywhere; }
.recent time { color: var(--muted); margin-right: .5rem; font-variant-numeric: tabular-nums; }
@media (max-width: 32rem) {
  .facts { grid-template-columns: 1fr; } .facts dd { margin-bottom: .35rem; }
  main { padding: .5rem; } .approval { padding: .75rem; }
}
"""

_SCRIPT = r"""
"use strict";
(() => {
  const API = "__API__";
  const MAX_REASON = __MAX_REASON__;
  const AGAIN_CHOICES = __AGAIN_CHOICES__;
  const TOKEN_KEY = "gatewayd.operator-token";
  // Reconnect waits: first, and the most it grows to (doubling, with jitter).
  const BACKOFF_FIRST_MS = 500, BACKOFF_MAX_MS = 15000;
  // Keep-alive periods without a byte after which the stream is presumed dead and reopened.
  const STALL_PERIODS = 3;
  // How long a finished approval stays on screen, so its outcome can be read.
  const FINISHED_SHOWN_MS = 10000;
  // Lines kept in "Recently finished".
  const RECENT_KEPT = 30;

  const $ = (id) => document.getElementById(id);
  const ui = {
    login: $("login"), token: $("token"), loginError: $("login-error"), live: $("live"), status: $("status"),
    list: $("list"), count: $("count"), stale: $("stale"), recent: $("recent"), signout: $("signout"),
    heading: $("pending-heading"),
  };
  const items = new Map();  // approval id -> entry
  let controller = null, retryTimer = null, stallTimer = null;
  let backoff = BACKOFF_FIRST_MS, keepaliveMs = 15000, serial = 0;

  const token = () => sessionStorage.getItem(TOKEN_KEY);
  const auth = () => ({ Authorization: "Bearer " + token() });

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "text") node.textContent = value;
      else if (key === "className") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) node.append(child);
    return node;
  }

  function duration(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + "\u00a0s";
    if (s < 3600) return Math.floor(s / 60) + "\u00a0min " + (s % 60) + "\u00a0s";
    return Math.floor(s / 3600) + "\u00a0h " + Math.floor((s % 3600) / 60) + "\u00a0min";
  }

  function setStatus(state, text) {
    ui.status.dataset.state = state;
    ui.status.textContent = text;
  }

  // -- signing in and out ------------------------------------------------------------------------

  function showLogin(error) {
    stop();
    ui.live.hidden = true;
    ui.signout.hidden = true;
    ui.login.hidden = false;
    ui.loginError.textContent = error || "";
    setStatus(error ? "refused" : "signed-out", error ? "Token refused" : "Not connected");
    ui.token.focus();
  }

  function refused() {
    sessionStorage.removeItem(TOKEN_KEY);
    clearList();
    showLogin("gatewayd refused this token (HTTP 401). Use an operator token ([operators.NAME] in " +
              "policies/), not an agent's token, and check it was pasted whole.");
  }

  ui.login.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = ui.token.value.trim();
    if (!value) {
      ui.loginError.textContent = "Enter your operator token.";
      ui.token.focus();
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, value);
    ui.token.value = "";
    connect();
  });

  ui.signout.addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    clearList();
    showLogin("");
  });

  // -- the live stream ---------------------------------------------------------------------------

  function stop() {
    clearTimeout(retryTimer);
    clearTimeout(stallTimer);
    const current = controller;
    controller = null;
    if (current) current.abort();
  }

  function connect() {
    stop();
    ui.login.hidden = true;
    ui.live.hidden = false;
    ui.signout.hidden = false;
    setStatus("connecting", "Connecting…");
    const ctrl = new AbortController();
    controller = ctrl;
    run(ctrl);
  }

  async function run(ctrl) {
    let response;
    try {
      response = await fetch(API + "/stream", {
        headers: { ...auth(), Accept: "text/event-stream" }, cache: "no-store", signal: ctrl.signal,
      });
    } catch (err) {
      if (ctrl === controller) retry("gatewayd cannot be reached");
      return;
    }
    if (ctrl !== controller) return;
    if (response.status === 401) { refused(); return; }
    if (!response.ok || !response.body) { retry("gatewayd answered HTTP " + response.status); return; }
    try {
      await read(response.body, ctrl);
    } catch (err) {
      // Aborted (stopped, or stalled) or the connection broke; decided below.
    }
    if (ctrl === controller) retry("the live stream ended");
  }

  function armStall(ctrl) {
    clearTimeout(stallTimer);
    stallTimer = setTimeout(() => { if (ctrl === controller) ctrl.abort(); },
                            Math.max(STALL_PERIODS * keepaliveMs, 5000));
  }

  async function read(body, ctrl) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    armStall(ctrl);
    for (;;) {
      const { value, done } = await reader.read();
      if (done || ctrl !== controller) return;
      armStall(ctrl);
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        dispatch(block);
      }
    }
  }

  function dispatch(block) {
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;  // keep-alive comment
      const colon = line.indexOf(":");
      const key = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (key === "event") name = value;
      else if (key === "data") data.push(value);
    }
    if (!data.length) return;
    const payload = JSON.parse(data.join("\n"));
    if (name === "snapshot") onSnapshot(payload);
    else if (name === "change") onChange(payload);
  }

  function retry(why) {
    clearTimeout(stallTimer);
    controller = null;
    ui.stale.hidden = items.size === 0;
    const wait = Math.min(backoff, BACKOFF_MAX_MS) * (0.75 + Math.random() / 2);
    backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
    setStatus("retrying", "Disconnected: " + why + ". Reconnecting in " + duration(wait / 1000) + "…");
    retryTimer = setTimeout(connect, wait);
  }

  function onSnapshot(payload) {
    backoff = BACKOFF_FIRST_MS;
    if (typeof payload.keepalive_s === "number") keepaliveMs = payload.keepalive_s * 1000;
    ui.stale.hidden = true;
    setStatus("live", "Live");
    const seen = new Set();
    for (const approval of payload.approvals) {
      seen.add(approval.id);
      upsert(approval);
    }
    for (const [id, entry] of items) {
      if (!seen.has(id) && !entry.finished) {
        markFinished(entry, "No longer pending: it was answered, expired or withdrawn while this page " +
                            "was disconnected.");
      }
    }
    render();
  }

  function onChange(change) {
    if (change.type === "pending") upsert(change.approval);
    else if (change.type === "finished") finish(change.approval);
    render();
  }

  // -- the list ----------------------------------------------------------------------------------

  function upsert(approval) {
    const known = items.get(approval.id);
    if (known) {
      known.expiresIn = approval.expires_in_s;
      known.age = approval.age_s;
      known.receivedAt = performance.now();
      return;
    }
    const entry = build(approval);
    items.set(approval.id, entry);
    ui.list.append(entry.node);
  }

  function build(approval) {
    const n = ++serial;
    const webAllowed = approval.channels.includes("web");
    const entry = { approval, finished: false, receivedAt: performance.now(), expiresIn: approval.expires_in_s,
                    age: approval.age_s };
    const heading = el("h3", { id: "approval-" + n },
      el("span", { className: "method", text: approval.method }), " ",
      el("span", { className: "from", text: "from " + approval.client }));
    entry.timer = el("p", { className: "timer" });
    const facts = el("dl", { className: "facts" });
    const fact = (term, value) => facts.append(el("dt", { text: term }), el("dd", { text: value }));
    fact("Approval id", approval.id);
    fact("Client", approval.client);
    fact("Method", approval.method);
    fact("Requested", new Date(approval.created * 1000).toLocaleString());
    fact("Arguments SHA-256", approval.params_sha256);
    const argsLabel = el("p", { className: "hint", id: "args-" + n,
                                text: "Arguments, exactly as the agent sent them — read them before approving:" });
    const args = el("pre", { className: "arguments", "data-field": "arguments", tabindex: "0",
                             "aria-labelledby": "args-" + n });
    args.textContent = JSON.stringify(approval.arguments, null, 2);
    entry.reason = el("input", { type: "text", id: "reason-" + n, maxlength: String(MAX_REASON),
                                 "data-field": "reason", autocomplete: "off" });
    const reasonLabel = el("label", { for: "reason-" + n, text: "Reason for denying (optional, sent to the agent)" });
    entry.again = el("select", { id: "again-" + n, "data-field": "allow-again" });
    for (const [seconds, label] of AGAIN_CHOICES) {
      entry.again.append(el("option", { value: String(seconds), text: label }));
    }
    const againLabel = el("label", { for: "again-" + n,
                                     text: "When approving, also let " + approval.client +
                                           " make this very call again (same arguments) without asking:" });
    entry.approve = el("button", { type: "button", className: "approve", "data-action": "approve",
                                   "aria-describedby": "approval-" + n, text: "Approve" });
    entry.deny = el("button", { type: "button", className: "deny", "data-action": "deny",
                                "aria-describedby": "approval-" + n, text: "Deny" });
    entry.message = el("p", { className: "message", role: "status", "data-field": "message" });
    entry.approve.addEventListener("click", () => decide(entry, true));
    entry.deny.addEventListener("click", () => decide(entry, false));
    const controls = el("div", { className: "decide" });
    if (webAllowed) {
      controls.append(reasonLabel, entry.reason, againLabel, entry.again,
                      el("div", { className: "buttons" }, entry.approve, entry.deny));
    } else {
      controls.append(el("p", { className: "warning", text: "Its policy does not take answers from this page. " +
                                "Answer with: gatewayctl approve " + approval.id + " (or deny)." }));
    }
    entry.node = el("li", { className: "approval", "data-approval-id": approval.id, "data-state": "pending",
                            "aria-labelledby": "approval-" + n },
                    heading, entry.timer, facts, argsLabel, args, controls, entry.message);
    tick(entry);
    return entry;
  }

  function tick(entry) {
    if (entry.finished) return;
    const elapsed = (performance.now() - entry.receivedAt) / 1000;
    const left = entry.expiresIn - elapsed;
    entry.node.classList.toggle("urgent", left < 15);
    entry.timer.textContent = (left > 0 ? "Expires in " + duration(left) : "Expiring now") +
                              " · waiting for " + duration(entry.age + elapsed);
  }

  function finish(approval) {
    const entry = items.get(approval.id);
    const said = outcome(approval);
    remember(approval.method + " from " + approval.client + " (" + approval.id + "): " + said);
    if (entry && !entry.finished) markFinished(entry, said, approval.state);
  }

  function outcome(approval) {
    const verb = { approved: "Approved", denied: "Denied", expired: "Expired", withdrawn: "Withdrawn" };
    let text = verb[approval.state] || approval.state;
    if (approval.decided_by) text += " by " + approval.decided_by;
    if (approval.reason) text += " — " + approval.reason;
    return text;
  }

  function markFinished(entry, text, state) {
    entry.finished = true;
    entry.node.dataset.state = state || "gone";
    entry.node.classList.add("finished");
    entry.node.classList.remove("urgent");
    entry.approve.disabled = entry.deny.disabled = entry.reason.disabled = true;
    entry.timer.textContent = text;
    entry.timer.classList.add("outcome");
    setTimeout(() => removeEntry(entry), FINISHED_SHOWN_MS);
  }

  function removeEntry(entry) {
    if (items.get(entry.approval.id) !== entry) return;
    const hadFocus = entry.node.contains(document.activeElement);
    items.delete(entry.approval.id);
    entry.node.remove();
    if (hadFocus) ui.heading.focus();
    render();
  }

  function clearList() {
    items.clear();
    ui.list.replaceChildren();
    render();
  }

  function render() {
    const waiting = [...items.values()].filter((entry) => !entry.finished).length;
    ui.count.textContent = waiting === 0 ? "No calls are waiting for a decision."
      : waiting === 1 ? "1 call is waiting for a decision." : waiting + " calls are waiting for a decision.";
    document.title = (waiting ? "(" + waiting + ") " : "") + "Approvals — gatewayd";
  }

  function remember(text) {
    const now = new Date();
    ui.recent.prepend(el("li", {}, el("time", { datetime: now.toISOString(), text: now.toLocaleTimeString() }),
                         text));
    while (ui.recent.children.length > RECENT_KEPT) ui.recent.lastElementChild.remove();
  }

  // -- answering ---------------------------------------------------------------------------------

  function say(entry, text, kind) {
    entry.message.className = "message" + (kind ? " " + kind : "");
    entry.message.textContent = text;
  }

  async function decide(entry, approve) {
    const reason = approve ? "" : entry.reason.value.trim().slice(0, MAX_REASON);
    const again = approve ? Number(entry.again.value) : 0;
    const answer = reason ? { reason } : again > 0 ? { allow_again_for: again } : {};
    entry.approve.disabled = entry.deny.disabled = true;
    say(entry, approve ? "Approving…" : "Denying…");
    let response;
    try {
      response = await fetch(API + "/" + encodeURIComponent(entry.approval.id) + (approve ? "/approve" : "/deny"), {
        method: "POST", cache: "no-store", headers: { ...auth(), "Content-Type": "application/json" },
        body: JSON.stringify(answer),
      });
    } catch (err) {
      say(entry, "gatewayd cannot be reached: your answer was not sent. Try again.", "bad");
      entry.approve.disabled = entry.deny.disabled = entry.finished;
      return;
    }
    if (response.status === 401) { refused(); return; }
    let body = null;
    try { body = await response.json(); } catch (err) { body = null; }
    const ok = Boolean(body && body.ok);
    say(entry, body && typeof body.message === "string" ? body.message : "gatewayd answered HTTP " + response.status,
        ok ? "ok" : "bad");
    if (body && body.approval && body.approval.state !== "pending") {
      if (!entry.finished) markFinished(entry, outcome(body.approval), body.approval.state);
    } else {
      entry.approve.disabled = entry.deny.disabled = entry.finished;
    }
  }

  setInterval(() => { for (const entry of items.values()) tick(entry); }, 1000);
  if (token()) connect(); else showLogin("");
})();
"""

_SCRIPT = (_SCRIPT.replace("__API__", API_PATH).replace("__MAX_REASON__", str(approvals.MAX_REASON_CHARS))
           .replace("__AGAIN_CHOICES__", json.dumps(ALLOW_AGAIN_CHOICES)))

_BODY = """
<header class="bar">
  <h1>gatewayd — approvals</h1>
  <p id="status" class="status" role="status" aria-live="polite" data-state="signed-out">Not connected</p>
  <button type="button" id="signout" class="quiet" hidden>Forget token</button>
</header>
<main>
  <noscript><p class="warning">This page needs JavaScript to read the live list and to answer.</p></noscript>
  <form id="login" class="card" method="post" autocomplete="off" novalidate hidden>
    <h2>Sign in</h2>
    <p class="hint">Paste your <strong>operator</strong> token. It stays in this browser tab only (session storage)
      and is sent in the Authorization header, never in the address bar.</p>
    <label for="token">Operator token</label>
    <input id="token" name="token" type="password" autocomplete="off" spellcheck="false" autocapitalize="off">
    <p id="login-error" class="error" role="alert"></p>
    <button type="submit" class="primary">Connect</button>
  </form>
  <section id="live" aria-labelledby="pending-heading" hidden>
    <h2 id="pending-heading" tabindex="-1">Calls waiting for a decision</h2>
    <p id="count" class="count"></p>
    <p id="stale" class="warning" hidden>Disconnected: this list may be out of date until the page reconnects.</p>
    <ol id="list" class="list"></ol>
    <h2 id="recent-heading">Recently finished</h2>
    <ul id="recent" class="recent" aria-labelledby="recent-heading"></ul>
  </section>
</main>
"""


def _csp_hash(code: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii") + "'"


_PAGE = (
    '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    "<title>Approvals — gatewayd</title>\n"
    f"<style>{_STYLE}</style>\n</head>\n<body>{_BODY}<script>{_SCRIPT}</script>\n</body>\n</html>\n"
).encode()
CSP = (
    f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; style-src {_csp_hash(_STYLE)}; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_API_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


# -- open streams, so shutdown can end them ----------------------------------------------------------------


@dataclass
class _Streams:
    """The watcher queues of the open live streams, and whether the daemon is stopping."""

    queues: set[asyncio.Queue[dict[str, Any] | None]] = field(default_factory=set)
    stopping: bool = False

    def watch(self, registry: approvals.Approvals) -> asyncio.Queue[dict[str, Any] | None]:
        queue = registry.watch()
        self.queues.add(queue)
        return queue

    def unwatch(self, registry: approvals.Approvals, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        registry.unwatch(queue)
        self.queues.discard(queue)

    def stop(self) -> None:
        """Wake every stream so it sees `stopping` and ends."""
        self.stopping = True
        for queue in self.queues:
            queue.put_nowait(None)


STREAMS = web.AppKey("console_streams", _Streams)


def add_routes(app: web.Application) -> None:
    """Register the page and its API on `app`, and end the live streams when it shuts down."""
    app[STREAMS] = _Streams()
    app.on_shutdown.append(_end_streams)
    app.router.add_get(PAGE_PATH, _page)
    app.router.add_get(f"{API_PATH}/pending", _pending)
    app.router.add_get(f"{API_PATH}/stream", _stream)
    app.router.add_post(API_PATH + "/{approval_id}/approve", _approve)
    app.router.add_post(API_PATH + "/{approval_id}/deny", _deny)


async def _end_streams(app: web.Application) -> None:
    """aiohttp waits for running handlers on shutdown: an open page must not hold the daemon up."""
    app[STREAMS].stop()


# -- handlers ---------------------------------------------------------------------------------------------


async def _page(request: web.Request) -> web.Response:
    """The page: static and without data, so no token is needed to load it."""
    return web.Response(body=_PAGE, content_type="text/html", charset="utf-8", headers=_PAGE_HEADERS)


def _operator(request: web.Request) -> str:
    """The operator's name, or HttpError(401) (no token, a wrong one, or an agent's)."""
    return request.app[STATE].tokens.operator(request.headers.get("Authorization"))


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=jsonrpc.dumps(body), status=status, content_type="application/json",
                        headers=_API_HEADERS)


def _views(registry: approvals.Approvals) -> list[dict[str, Any]]:
    return [approval.view() for approval in registry.pending()]


async def _pending(request: web.Request) -> web.Response:
    """GET .../pending: the pending approvals, oldest first."""
    _operator(request)
    return _json({"approvals": _views(request.app[STATE].gateway.approvals)})


async def _approve(request: web.Request) -> web.Response:
    """POST .../{id}/approve."""
    return await _decide(request, approve=True)


async def _deny(request: web.Request) -> web.Response:
    """POST .../{id}/deny."""
    return await _decide(request, approve=False)


async def _decide(request: web.Request, *, approve: bool) -> web.Response:
    """Answer one approval: 200 when this answer decided it, 409 when it could not (already finished, or its
    policy does not take web answers), 404 when it is unknown."""
    state = request.app[STATE]
    name = _operator(request)
    reason, again = _answer(await _read_body(request), approve)
    approval_id = request.match_info["approval_id"]
    answer = state.gateway.approvals.decide(
        approval_id, approve=approve, by=f"operator {name} (web page)", channel=approvals.WEB, reason=reason,
        allow_again_for=again,
    )
    _log_answer(name, approve, approval_id, answer)
    view = answer.approval.view() if answer.approval is not None else None
    status = 200 if answer.ok else 404 if answer.approval is None else 409
    return _json({"ok": answer.ok, "message": answer.message, "approval": view}, status=status)


def _log_answer(name: str, approve: bool, approval_id: str, answer: approvals.Answer) -> None:
    verb = "approved" if approve else "denied"
    if answer.ok and answer.approval is not None:
        found = answer.approval
        logger.info("operator %s %s approval %s on the web page: client=%s method=%s%s", name, verb, found.id,
                    found.client, found.method, f" reason={found.reason!r}" if found.reason else "")
    else:
        logger.info("operator %s: web answer (%s) to approval %.40r changed nothing: %s", name, verb, approval_id,
                    answer.message)


async def _read_body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_DECISION_BODY_BYTES:
        raise HttpError(413, f"body larger than {MAX_DECISION_BODY_BYTES} bytes")
    data = await request.read()
    if len(data) > MAX_DECISION_BODY_BYTES:
        raise HttpError(413, f"body larger than {MAX_DECISION_BODY_BYTES} bytes")
    return data


def _answer(data: bytes, approve: bool) -> tuple[str | None, float | None]:
    """The optional reason and "allow again" seconds from a body `{"reason": "...", "allow_again_for": 600}`
    (or none); HttpError(400) for anything else."""
    try:
        return approvals.parse_answer(json.loads(data) if data.strip() else None, approve=approve)
    except RecursionError:
        raise HttpError(400, 'the body must be JSON: {"reason": "..."}, or empty') from None
    except ValueError as exc:  # json's own errors are ValueErrors too, and say where the JSON broke
        raise HttpError(400, str(exc)) from None


# -- the live stream --------------------------------------------------------------------------------------


def _event(name: str, payload: dict[str, Any]) -> bytes:
    """One SSE event: its name, and its payload as single-line JSON."""
    return b"event: " + name.encode("ascii") + b"\ndata: " + jsonrpc.dumps(payload) + b"\n\n"


async def _write(response: web.StreamResponse, data: bytes) -> None:
    async with asyncio.timeout(WRITE_TIMEOUT):
        await response.write(data)


async def _stream(request: web.Request) -> web.StreamResponse:
    """GET .../stream: `snapshot` (the whole list), then a `change` per change, keep-alive comments between;
    a fresh `snapshot` if this reader fell behind. Ends when the reader goes or the daemon stops."""
    state = request.app[STATE]
    name = _operator(request)
    streams = request.app[STREAMS]
    if streams.stopping:
        raise HttpError(503, "gatewayd is stopping", {"Retry-After": str(RETRY_AFTER_S)})
    if len(streams.queues) >= MAX_STREAMS:
        raise HttpError(503, f"{MAX_STREAMS} approval pages are open already; close one",
                        {"Retry-After": str(RETRY_AFTER_S)})
    response = web.StreamResponse(headers={**sse.HEADERS, **_API_HEADERS})
    await response.prepare(request)
    logger.debug("operator %s opened the approval stream", name)
    try:
        await _feed(response, state.gateway.approvals, streams, state.settings.sse_keepalive)
    except (ConnectionError, TimeoutError):
        logger.debug("operator %s: approval stream closed or too slow", name)
    return response


async def _feed(
    response: web.StreamResponse, registry: approvals.Approvals, streams: _Streams, keepalive: float
) -> None:
    """Write the list, then its changes, until the daemon stops. Watching starts before the list is read, so
    no change is missed; one may arrive twice, which the page takes in its stride."""
    queue = streams.watch(registry)
    try:
        await _write(response, _snapshot(registry, keepalive))
        while not streams.stopping:
            try:
                async with asyncio.timeout(keepalive):
                    change = await queue.get()
            except TimeoutError:
                await _write(response, sse.KEEPALIVE)
                continue
            if streams.stopping:
                return
            if change is None:
                # Too far behind: Approvals dropped this queue. Watch afresh, then send the whole list again.
                streams.unwatch(registry, queue)
                queue = streams.watch(registry)
                await _write(response, _snapshot(registry, keepalive))
            else:
                await _write(response, _event(CHANGE, change))
    finally:
        streams.unwatch(registry, queue)


def _snapshot(registry: approvals.Approvals, keepalive: float) -> bytes:
    # keepalive_s lets the page notice a silently dead connection (no byte for a few periods).
    return _event(SNAPSHOT, {"approvals": _views(registry), "keepalive_s": keepalive})
