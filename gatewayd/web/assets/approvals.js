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

  // What came from a call (its method, client, arguments, and who decided why) is rendered only from the
  // approval's `shown` form: gatewayd escapes control, bidi and invisible characters there (display.py), which
  // textContent alone would still let reorder or hide what the operator reads.
  function build(approval) {
    const n = ++serial;
    const shown = approval.shown;
    const webAllowed = approval.channels.includes("web");
    const entry = { approval, finished: false, receivedAt: performance.now(), expiresIn: approval.expires_in_s,
                    age: approval.age_s };
    const heading = el("h3", { id: "approval-" + n },
      el("span", { className: "method", text: shown.method }), " ",
      el("span", { className: "from", text: "from " + shown.client }));
    entry.timer = el("p", { className: "timer" });
    const facts = el("dl", { className: "facts" });
    const fact = (term, value) => facts.append(el("dt", { text: term }), el("dd", { text: value }));
    fact("Approval id", approval.id);
    fact("Client", shown.client);
    fact("Method", shown.method);
    fact("Requested", new Date(approval.created * 1000).toLocaleString());
    fact("Arguments SHA-256", approval.params_sha256);
    const argsLabel = el("p", { className: "hint", id: "args-" + n,
                                text: "Arguments, exactly as the agent sent them — read them before approving:" });
    const args = el("pre", { className: "arguments", "data-field": "arguments", tabindex: "0",
                             "aria-labelledby": "args-" + n });
    args.textContent = shown.arguments;
    entry.reason = el("input", { type: "text", id: "reason-" + n, maxlength: String(MAX_REASON),
                                 "data-field": "reason", autocomplete: "off" });
    const reasonLabel = el("label", { for: "reason-" + n, text: "Reason for denying (optional, sent to the agent)" });
    entry.again = el("select", { id: "again-" + n, "data-field": "allow-again" });
    for (const [seconds, label] of AGAIN_CHOICES) {
      entry.again.append(el("option", { value: String(seconds), text: label }));
    }
    const againLabel = el("label", { for: "again-" + n,
                                     text: "When approving, also let " + shown.client +
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
    remember(approval.shown.method + " from " + approval.shown.client + " (" + approval.id + "): " + said);
    if (entry && !entry.finished) markFinished(entry, said, approval.state);
  }

  function outcome(approval) {
    const verb = { approved: "Approved", denied: "Denied", expired: "Expired", withdrawn: "Withdrawn" };
    let text = verb[approval.state] || approval.state;
    if (approval.shown.decided_by) text += " by " + approval.shown.decided_by;
    if (approval.shown.reason) text += " — " + approval.shown.reason;
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
