"""The audit log: an append-only JSON Lines file, one record per decision and one per outcome.

Owns the file (open, append, fsync, reopen for rotation), how a record is framed (`seq`, `time`,
exactly one line whatever its content), the log's health, and the helpers that make a call's
arguments fit to record: `params_hash`, `summarize`, `trace_id`. Does not own which events are
recorded or when (gateway.py), nor the SIGUSR1 wiring (app.py).

Durable and ordinary records. `record(event, durable=True)` (a call that needs confirmation or is
marked dangerous, before it runs) returns only once the line is written and fsync'd; when that is
impossible it raises `AuditUnavailable` and the call must not run. Any other record never raises
and never waits for the disk: it is queued, and if it cannot be written it is counted and logged.
So a broken audit disk stops dangerous calls and nothing else.

Health. The log is unhealthy while its file is not open (it could not be opened, or a write or an
fsync failed and it was closed) or while a write has been stuck for longer than the write timeout.
Becoming unhealthy is logged at ERROR at once, lost records at most every FAILURE_LOG_INTERVAL,
and `status()` says so. The writer tries the file again at most every REOPEN_RETRY_INTERVAL when
records arrive; `reopen()` tries at once.

Rotation is by signal, not by size: rename the file, then `kill -USR1 <daemon pid>` (logrotate:
rename, never `copytruncate`; `postrotate` sends the signal). The daemon calls `reopen()`; records
queued before it land in the renamed file, later ones in a new file at the configured path, each
whole and in order. The daemon itself never deletes or truncates audit data.

Format: one compact JSON object per line, `seq` (1, 2, … per daemon run, no gaps among written
records) and `time` (RFC 3339 UTC with milliseconds, taken when the event was recorded) first,
then the event's own fields. JSON escapes C0 controls; DEL, C1 controls (8-bit CSI among them),
U+2028/U+2029 and the bidi controls are escaped too, so no string can end a line or disguise one. After
a crash the last line may be torn; the next start begins on a fresh line.

Bounds. A client chooses `method` and `request_id` and can make them megabytes long; so that it
cannot turn a within-limits request rate into a flood of disk writes, the fields a caller can reach
(`method`, `request_id`, `trace_id`, `client`, `session`) are cut to FIELD_MAX_CHARS at encode time
(`_cut`: a prefix, then how much was dropped); a request id that is not a string, an integer or
null is written as its summary if it makes the line that long. The params are already bounded
(`summarize`). A record still longer than RECORD_MAX_CHARS (a field nobody bounded) is written as
its summary, marked `summarized_from_chars`. Only a line longer than FIELD_MAX_CHARS can hold a
field to cut, so a typical record pays one length check.

Where the work is done. A record is encoded when it is queued, on the event loop (an ordinary call's outcome is
queued in the loop turn after its answer was written: records.py); the writer thread only numbers the lines, joins
them and writes. Encoding a batch of records in the writer held the GIL for ~1 ms at a time, and the loop, waiting
for it, held back every call in flight: encoded when queued, calls/s ×1.04 and p99 ×0.83–0.85 at 32 in flight
(bench.ab, 8 pairs).

Disk reserve. `AuditLog(path, reserve_bytes=N)` keeps N bytes of the audit file system for durable
records: while less than that is free, ordinary records are dropped (counted in `records_failed`
and `records_dropped_for_space`, logged at ERROR once when it starts, at WARNING once when it ends,
`status()["space_low"]`), and durable ones are still written while there is any room at all. So a
flood of ordinary records (or anything else filling that disk) stops dangerous calls only once the
disk is really full, not before. The writer measures free space (`fstatvfs` of the open file) when
it opens the file, then again after SPACE_CHECK_INTERVAL or SPACE_CHECK_BYTES written, whichever
comes first, and sooner when its own count of bytes says the reserve may be crossed; ordinary
records stop within one batch of the reserve and resume once free space is SPACE_RESUME_MARGIN
above it. The log stays healthy meanwhile: `healthy` means a durable record can be written.

`AuditLog(None)` disables auditing: every record is dropped and succeeds. The daemon's default
is a real path, so dangerous calls are audited unless an operator turns auditing off.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import json
import logging
import math
import os
import queue
import random
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatewayd import jsontext
from gatewayd.errors import AuditUnavailable

logger = logging.getLogger(__name__)

# The file holds client names and argument summaries: only the daemon's user may read it.
FILE_MODE = 0o600
# A durable record not on disk within this time counts as failed: refuse the call rather than hang on a sick disk.
WRITE_TIMEOUT = 10.0
# How long close() waits for queued records before giving up on a stuck disk.
CLOSE_TIMEOUT = 10.0
# Ordinary records waiting beyond this are dropped and counted, so a slow disk cannot grow memory without bound.
MAX_QUEUED = 10_000
# Ordinary records reach the writer in batches of this many, or after this long, whichever comes first.
HANDOVER_BATCH = 128
HANDOVER_INTERVAL = 0.05
# Most items handled before one fsync covers them; bounds how long the first durable record of a burst waits.
MAX_BATCH = 256
# While the file is unusable, the writer tries it again at most this often (reopen() tries at once).
REOPEN_RETRY_INTERVAL = 5.0
# Lost records are reported at most this often, with a count, so a dead disk cannot flood the daemon's log.
FAILURE_LOG_INTERVAL = 10.0
# Free space is measured again this often, to see other writers fill the disk and space come back; one
# fstatvfs a second costs nothing.
SPACE_CHECK_INTERVAL = 1.0
# ...and after this much written, since the writer's own count (free minus what it wrote) misses blocks and metadata.
SPACE_CHECK_BYTES = 1024 * 1024
# Ordinary records resume only once free space is this fraction of the reserve above it, so a disk that hovers
# at the line does not flip between dropping and writing (and log each flip).
SPACE_RESUME_MARGIN = 1 / 8

# Longest method, request id, trace id, client or session written whole: far above any real one (tool names are
# short, ids are counters or UUIDs), and still a line of a few KiB plus the params summary.
FIELD_MAX_CHARS = 1024
# A summary is under ~16 KiB and every other field is short: a longer line holds a field nobody bounded.
RECORD_MAX_CHARS = 64 * 1024

# summarize() bounds, so a summary stays under ~16 KiB whatever the arguments.
SUMMARY_MAX_STRING = 200
SUMMARY_MAX_KEY = 64
SUMMARY_MAX_ITEMS = 20
SUMMARY_MAX_DEPTH = 4
SUMMARY_MAX_NODES = 50
REDACTED = "[redacted]"
TOO_DEEP = "[…]"
# Key names holding any of these (case-insensitive, `_` and `-` ignored) have their values redacted.
# Deliberately broad: `max_tokens` is redacted too, and hiding a number costs less than leaking a key.
SECRET_KEY_PARTS = (
    "token", "secret", "password", "passwd", "apikey", "authorization", "cookie", "credential", "privatekey",
)

# Argument names are few and repeat on every call: the verdicts on this many short ones are remembered.
SECRET_KEY_CACHE = 1024

# W3C Trace Context, version 00: lowercase hex only; all-zero trace or parent ids are invalid.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
# Characters JSON leaves raw that some reader would take as a line break, a terminal control or a reordering.
_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# The writer puts these first itself; an event cannot set them.
_FRAMED = ("seq", "time")
# The fields a caller reaches (a client sends method and id); the writer cuts them to FIELD_MAX_CHARS.
_BOUNDED = ("method", "request_id", "trace_id", "client", "session")
# Integers from here on have more digits than FIELD_MAX_CHARS.
_HUGE_INT = 10**FIELD_MAX_CHARS


# The canonical form params_hash hashes.
_CANONICAL = jsontext.encoder(sort_keys=True, default=str)
# A canonical form longer than this is hashed by OpenSSL's SHA-256, loaded when first needed: lean_import.py keeps
# libcrypto out of a start (3.6 MB of an idle daemon), and Python's own SHA-256, as fast for a call's usual few
# hundred bytes, is ~5× slower over large input (3–4 ms a MiB against 0.6–0.8), on the event loop.
LARGE_HASH_BYTES = 64 * 1024


# -- helpers for the integrator ------------------------------------------------------------


def params_hash(params: Any, flat: bool = False) -> str:
    """SHA-256 hex of the canonical JSON of `params`: equal for equal values whatever their key order. `flat`: its
    caller knows `summarize(params) is params` (nothing in it is long), which spares the look for a large string.

    Not a secret: a low-entropy argument can be guessed from it, one reason the file is 0600.
    """
    if not flat and jsontext.carries_large_string(params):
        # A large argument's text is made a part at a time, its large strings from their bytes (jsontext.py): the
        # per-character escaper takes ~5 ms a MiB on the event loop.
        digest = _large_sha256()()
        for part in jsontext.parts(params, _canonical_bytes, sort_keys=True, errors="surrogatepass"):
            digest.update(part)
        return str(digest.hexdigest())
    # A lone surrogate (legal in a JSON string escape) must hash, not raise.
    canonical = _canonical_bytes(params)
    if len(canonical) > LARGE_HASH_BYTES:
        return str(_large_sha256()(canonical).hexdigest())
    return hashlib.sha256(canonical).hexdigest()


def _canonical_bytes(value: Any) -> bytes:
    return _CANONICAL(value).encode("utf-8", "surrogatepass")


@functools.cache
def _large_sha256() -> Callable[..., Any]:
    """OpenSSL's SHA-256 (the same digest), or Python's own where this Python has no OpenSSL."""
    try:
        import _hashlib  # loaded by the first large hash only: see LARGE_HASH_BYTES
    except ImportError:
        return hashlib.sha256
    return _hashlib.openssl_sha256


def summarize(params: Any) -> Any:
    """A redacted, bounded form of `params` for the record; the input is not changed.

    Values under secret-looking keys become REDACTED; long strings and keys are cut with a marker
    saying how much was dropped; containers keep SUMMARY_MAX_ITEMS items and, past
    SUMMARY_MAX_DEPTH, become TOO_DEEP; at most SUMMARY_MAX_NODES values are kept in all.
    Redaction is by key name only, which is why records carry the hash, never the raw arguments.
    Arguments with nothing to cut or redact (the usual flat object) are their own summary: `params`
    itself comes back, not a copy, so treat a summary as read-only.
    """
    return params if _summary_is_itself(params) else _Summary().value(params, 0)


def _summary_is_itself(params: Any) -> bool:
    """Whether summarize(params) == params, checked in one flat pass: no arguments, or an object of at most
    SUMMARY_MAX_ITEMS short, not secret-looking names holding short strings, finite numbers, booleans or nulls."""
    if params is None:
        return True
    if type(params) is not dict or len(params) > SUMMARY_MAX_ITEMS:
        return False
    for key, value in params.items():
        if type(key) is not str or len(key) > SUMMARY_MAX_KEY or _short_name_looks_secret(key):
            return False
        kind = type(value)
        if kind is str:
            if len(value) > SUMMARY_MAX_STRING:
                return False
        elif kind is float:
            if not math.isfinite(value):
                return False
        elif kind is not int and kind is not bool and value is not None:
            return False
    return True


def trace_id(meta: Any) -> str:
    """The trace id of a well-formed `_meta.traceparent`, else a fresh random 32-hex id."""
    header = meta.get("traceparent") if isinstance(meta, dict) else None
    if isinstance(header, str):
        match = _TRACEPARENT.fullmatch(header)
        if match and match[1] != "0" * 32 and match[2] != "0" * 16:
            return match[1]
    # A correlation id, not a secret: the process's PRNG, without a getrandom() system call per call.
    return f"{random.getrandbits(128):032x}"


class _Summary:
    """One summarize() walk and the node budget it spends."""

    def __init__(self) -> None:
        self.left = SUMMARY_MAX_NODES

    def value(self, value: Any, depth: int) -> Any:
        self.left -= 1
        if isinstance(value, str):
            return _cut(value, SUMMARY_MAX_STRING)
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)  # NaN and Infinity are not JSON; a strict reader must still parse the record
        if value is None or isinstance(value, bool | int | float):
            return value
        if not isinstance(value, dict | list | tuple):
            return f"<{type(value).__name__}>"
        if depth >= SUMMARY_MAX_DEPTH:
            return TOO_DEEP
        return self._object(value, depth) if isinstance(value, dict) else self._array(value, depth)

    def _object(self, value: dict[Any, Any], depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for count, (key, item) in enumerate(value.items()):
            if count >= SUMMARY_MAX_ITEMS or self.left <= 0:
                out["…"] = f"[{len(value) - count} more keys]"
                break
            name = _cut(str(key), SUMMARY_MAX_KEY)
            if name in out:  # two long keys cut to the same text must not overwrite each other
                name = f"{name}#{count}"
            if _looks_secret(str(key)):
                self.left -= 1
                out[name] = REDACTED
            else:
                out[name] = self.value(item, depth + 1)
        return out

    def _array(self, value: list[Any] | tuple[Any, ...], depth: int) -> list[Any]:
        out: list[Any] = []
        for count, item in enumerate(value):
            if count >= SUMMARY_MAX_ITEMS or self.left <= 0:
                out.append(f"…[{len(value) - count} more items]")
                break
            out.append(self.value(item, depth + 1))
        return out


def _looks_secret(key: str) -> bool:
    # Only short names are remembered: a cache of client-chosen long keys would grow memory with them.
    return _short_name_looks_secret(key) if len(key) <= SUMMARY_MAX_KEY else _has_secret_part(key)


@functools.lru_cache(maxsize=SECRET_KEY_CACHE)
def _short_name_looks_secret(key: str) -> bool:
    return _has_secret_part(key)


def _has_secret_part(key: str) -> bool:
    folded = key.lower().replace("_", "").replace("-", "")
    return any(part in folded for part in SECRET_KEY_PARTS)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} more chars]"


# -- record framing ------------------------------------------------------------------------


class _Clock:
    """RFC 3339 timestamps, formatting the date and time only once a second (it showed in profiles)."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((now - second) * 1000):03d}Z"


# RFC 3339 UTC with milliseconds: 2025-01-31T12:00:00.123Z.
_now = _Clock()


_ENCODER = jsontext.encoder(allow_nan=False, default=str)


def _encode_body(event: dict[str, Any]) -> bytes:
    """The event as the tail of a record line (everything after `"time":"…"`), newline included."""
    fields = {key: value for key, value in event.items() if key not in _FRAMED} if _FRAMED & event.keys() else event
    try:
        text = _ENCODER(fields)
        if len(text) > FIELD_MAX_CHARS:  # a shorter line cannot hold a field to cut: most records stop here
            text = _bounded(fields, text)
    except (TypeError, ValueError, RecursionError) as exc:
        text = _unencodable(event, exc)
    if not text.isascii() or "\x7f" in text:  # the common case skips the scan
        text = _UNSAFE.sub(lambda match: f"\\u{ord(match[0]):04x}", text)
    tail = "}" if text == "{}" else "," + text[1:]
    # Lone surrogates have no UTF-8 form; backslashreplace writes each as a JSON "\\udxxx" escape.
    return (tail + "\n").encode("utf-8", "backslashreplace")


def _bounded(fields: dict[str, Any], text: str) -> str:
    """`text`, the encoded `fields`, again with the fields a caller reaches cut, and summarized if still too long."""
    changed: dict[str, Any] | None = None
    for key in _BOUNDED:
        value = fields.get(key)
        kind = type(value)
        # The usual case, checked inline: a long params summary brings most records here with nothing to cut.
        if value is None or (kind is str and len(value) <= FIELD_MAX_CHARS) or (
                kind is int and -_HUGE_INT < value < _HUGE_INT):
            continue
        bounded = _bounded_field(value)
        if bounded is not value:
            changed = changed if changed is not None else dict(fields)
            changed[key] = bounded
    if changed is not None:
        fields = changed
        text = _ENCODER(fields)
    if len(text) > RECORD_MAX_CHARS:
        text = _ENCODER({**summarize(fields), "summarized_from_chars": len(text)})
    return text


def _bounded_field(value: Any) -> Any:
    """`value` itself if it is short, else a bounded stand-in."""
    kind = type(value)
    if kind is str:
        return _cut(value, FIELD_MAX_CHARS)
    if kind is int:
        return value if -_HUGE_INT < value < _HUGE_INT else _cut(str(value), FIELD_MAX_CHARS)
    if value is None or kind is bool or kind is float:
        return value
    return summarize(value)


def _unencodable(event: dict[str, Any], exc: Exception) -> str:
    """A record saying the event could not be encoded: a NaN, a cycle or an integer too long for text is a bug in
    the caller, but the call must still leave a record."""
    try:
        shown = _cut(repr(event), SUMMARY_MAX_STRING * 10)
    except (ValueError, RecursionError):  # what made encoding fail can make repr fail too
        shown = f"<{len(event)} fields>"
    return json.dumps({"unencodable_event": shown, "error": str(exc)}, ensure_ascii=False)


def _describe(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{name}: {exc.strerror}" if name and exc.strerror else str(exc)


def _size(count: int | None) -> str:
    return "an unknown amount" if count is None else f"{count / (1024 * 1024):.1f} MiB"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _start_on_fresh_line(fd: int, info: os.stat_result) -> None:
    """If the file ends in a torn line (a crash mid-write), end it so the next record stands alone."""
    if stat.S_ISREG(info.st_mode) and info.st_size > 0 and os.pread(fd, 1, info.st_size - 1) != b"\n":
        _write_all(fd, b"\n")


def _sync_directory(directory: Path) -> None:
    """Make a newly created file's name durable too; best effort (some filesystems refuse)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _Space:
    """Whether the audit file system has less free space than the reserve; for the writer thread only.

    Measured (fstatvfs of the open file: the file system it is really on) when the file opens, then again once
    SPACE_CHECK_INTERVAL has passed or SPACE_CHECK_BYTES were written, or sooner when free space as last measured
    minus what the writer wrote since says the reserve may have been crossed. Between those, one clock read.
    """

    def __init__(self, reserve: int) -> None:
        self.reserve = reserve
        self.free: int | None = None  # as last measured; None: no reserve, not a regular file, or not measurable
        self._below = False
        self._applies = False
        self._measured_at = -math.inf
        self._written = 0

    def opened(self, fd: int, info: os.stat_result) -> None:
        # Free space on the file system of a FIFO or a device says nothing about room for records.
        self._applies = self.reserve > 0 and stat.S_ISREG(info.st_mode)
        self.free = None
        if self._applies:
            self._measure(fd)
        else:
            self._below = False

    def low(self, fd: int) -> bool:
        """Whether ordinary records must be dropped now, measuring again if due."""
        if self._applies and self._due():
            self._measure(fd)
        return self._below

    def wrote(self, count: int) -> None:
        self._written += count

    def _due(self) -> bool:
        if self._written >= SPACE_CHECK_BYTES or time.monotonic() - self._measured_at >= SPACE_CHECK_INTERVAL:
            return True
        # Not yet dropping, and by the writer's own count the reserve may be reached: look before going on.
        return not self._below and self.free is not None and self.free - self._written < self.reserve

    def _measure(self, fd: int) -> None:
        self._measured_at = time.monotonic()
        self._written = 0
        try:
            info = os.fstatvfs(fd)
        except OSError:
            self.free, self._below = None, False  # cannot tell: never drop records on a guess
            return
        # f_bavail: what an unprivileged writer may still use (the daemon's user), not the root-only reserve.
        self.free = info.f_bavail * info.f_frsize
        line = self.reserve * (1 + SPACE_RESUME_MARGIN) if self._below else self.reserve
        self._below = self.free < line


# -- the log -------------------------------------------------------------------------------

# Resolved with None when done (durable: on disk), else the reason it is not.
Done = asyncio.Future[str | None]


@dataclass(slots=True)
class _Record:
    stamp: str
    # The line after its `seq` and `time` (`_encode_body`): encoded when queued, so that the writer thread holds the
    # GIL only to join lines (see the module's docstring).
    body: bytes
    done: Done | None  # None: an ordinary record nobody waits for


@dataclass
class _Flush:
    done: Done


@dataclass
class _Reopen:
    done: Done | None


@dataclass
class _Stop:
    done: Done


_Item = _Record | _Flush | _Reopen | _Stop


class AuditLog:
    """The audit file and its one writer thread.

    One dedicated thread, fed by a FIFO queue, owns the file descriptor, rather than
    `asyncio.to_thread` per write:
    - fsync takes milliseconds, or forever on a sick disk; it never runs on the event loop, and a
      stuck one holds this thread only, not the default executor the rest of the daemon shares;
    - records reach the file in the order `record()` was called, and `seq` is assigned by the only
      thread that writes, so seq order is file order without a lock around I/O;
    - a caller cancelled while it waits cannot tear or reorder the file: its record is already queued
      and is written whole (with to_thread, a cancellation releases the lock while a write still runs);
    - durable records that wait together share one fsync.
    """

    def __init__(self, path: Path | None, *, write_timeout: float = WRITE_TIMEOUT, reserve_bytes: int = 0) -> None:
        """`reserve_bytes`: free space on the file's file system below which ordinary records are dropped so that
        durable ones still fit (0: none)."""
        self.path = path
        self.enabled = path is not None
        self._timeout = write_timeout
        self._queue: queue.SimpleQueue[list[_Item]] = queue.SimpleQueue()
        # Items of the current event-loop turn, handed to the writer together: one wake-up of the thread per
        # turn, not per record (measured: a wake-up per record cost more than the rest of a call).
        self._turn: list[_Item] = []
        self._handover_soon = False
        self._handover_timer: asyncio.TimerHandle | None = None
        # Records queued and not yet taken by the writer = submitted - taken; each counter has one writing
        # thread, so no lock is taken per record.
        self._submitted = 0
        self._taken = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        # Writer thread only.
        self._fd: int | None = None
        self._unsynced: list[_Record | _Flush] = []
        self._last_open = -math.inf
        self._broken = False
        self._space = _Space(reserve_bytes)
        self._dropped_in_episode = 0
        # Shared with the event loop's thread (status(), dropped records): guarded by _lock.
        self._lock = threading.Lock()
        self._seq = 0
        self._written = 0
        self._failed = 0
        self._last_error: str | None = None
        self._busy_since: float | None = None
        self._unreported = 0
        self._last_report = -math.inf
        self._space_low = False
        self._free_bytes: int | None = None
        self._dropped_for_space = 0

    # -- event loop side -------------------------------------------------------------------

    async def start(self) -> None:
        """Start the writer and open the file. Never raises: a file that cannot be opened leaves the log unhealthy."""
        if self.path is None:
            logger.warning("audit log disabled: no path configured")
            return
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="gatewayd-audit", daemon=True)
        self._thread.start()
        opened: Done = self._loop.create_future()
        self._submit(_Reopen(opened))
        await self._wait(opened)

    async def record(self, event: dict[str, Any], *, durable: bool) -> None:
        """Append one record. Durable: returns once it is on disk, else raises AuditUnavailable.
        Ordinary: queued; never raises, never waits; a record that cannot be written is counted and logged."""
        if not durable:
            self.queue(event)
            return
        if self.path is None:
            return
        if self._loop is None or self._closing:
            raise self._unavailable("audit log is not running")
        done: Done = self._loop.create_future()
        self._submit(_Record(_now(), _encode_body(event), done))
        reason = await self._wait(done)
        if reason is not None:
            raise self._unavailable(reason)

    def queue(self, event: dict[str, Any]) -> None:
        """Append an ordinary record: queued; never raises, never waits. One that cannot be written is counted and
        logged. (`record(event, durable=False)` as a plain function, for the call path.)"""
        if self.path is None:
            return
        if self._loop is None or self._closing:
            self._lose(1, "audit log is not running")
        elif self._submitted - self._taken >= MAX_QUEUED:
            self._lose(1, f"more than {MAX_QUEUED} records waiting for the disk")
        else:
            self._submit(_Record(_now(), _encode_body(event), None))

    async def flush(self) -> None:
        """Return once every record queued before this call is on disk or counted as failed (bounded by the
        write timeout)."""
        if self._loop is None or self._closing:
            return
        done: Done = self._loop.create_future()
        self._submit(_Flush(done))
        await self._wait(done)

    def reopen(self) -> None:
        """Close the file and open `path` again (after rotation, or to retry after a failure). Returns at once:
        records queued before it go to the old file, later ones to the new one. Safe in a signal handler."""
        if self._loop is None or self._closing:
            return
        logger.info("audit log %s: reopening", self.path)
        self._submit(_Reopen(None))

    async def close(self) -> None:
        """Write what is queued, then close the file and end the writer."""
        if self._loop is None or self._closing:
            return
        self._closing = True
        done: Done = self._loop.create_future()
        self._submit(_Stop(done))
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await done
        except TimeoutError:
            logger.error("audit log %s: writer stuck for %gs at close; queued records may be lost",
                         self.path, CLOSE_TIMEOUT)
        with self._lock:
            unreported, self._unreported = self._unreported, 0
        if unreported:
            logger.error("audit log %s: %d more records were not written", self.path, unreported)

    @property
    def healthy(self) -> bool:
        """Whether a durable record can be written now (always true when auditing is disabled)."""
        return bool(self.status()["healthy"])

    def status(self) -> dict[str, Any]:
        """Path, health, last error, the last sequence number, records written, and records failed: not
        written, or durable ones whose fsync failed (those may also be in the file, with their seq). Then the
        disk reserve: whether free space is below it (`space_low`: ordinary records are being dropped), the free
        space last measured (None: no reserve, or not measurable), and the ordinary records dropped for it."""
        with self._lock:
            stuck = self._busy_since is not None and time.monotonic() - self._busy_since > self._timeout
            return {
                "path": str(self.path) if self.path is not None else None,
                "enabled": self.path is not None,
                "healthy": self.path is None or (self._fd is not None and not stuck and not self._closing),
                "last_error": self._last_error,
                "records_written": self._written,
                "records_failed": self._failed,
                "seq": self._seq,
                "space_low": self._space_low,
                "free_bytes": self._free_bytes,
                "reserve_bytes": self._space.reserve,
                "records_dropped_for_space": self._dropped_for_space,
            }

    async def _wait(self, done: Done) -> str | None:
        try:
            async with asyncio.timeout(self._timeout):
                return await done
        except TimeoutError:
            reason = f"the audit disk did not answer within {self._timeout:g}s"
            self._lose(0, reason)
            return reason

    def _unavailable(self, reason: str) -> AuditUnavailable:
        # The reason reaches the caller; the server's file path stays in the daemon's log.
        return AuditUnavailable("the audit log cannot record this call, so it was not run", {"reason": reason})

    def _lose(self, count: int, reason: str) -> None:
        """Count records that did not reach the file and say so at ERROR, at most every FAILURE_LOG_INTERVAL."""
        now = time.monotonic()
        with self._lock:
            self._failed += count
            self._unreported += count
            self._last_error = reason
            if now - self._last_report < FAILURE_LOG_INTERVAL:
                return
            unreported, self._unreported, self._last_report = self._unreported, 0, now
        logger.error("audit log %s failing: %s (%d records not written since the last report)",
                     self.path, reason, unreported)

    def _submit(self, item: _Item) -> None:
        """Queue an item for the writer, in order. Anyone waiting (durable records, flush, reopen, close) is
        handed over at the end of this event-loop turn; ordinary records wait for a batch or HANDOVER_INTERVAL,
        since every wake-up of the writer costs the event loop a GIL hand-off."""
        assert self._loop is not None
        self._turn.append(item)
        self._submitted += 1
        urgent = not isinstance(item, _Record) or item.done is not None or len(self._turn) >= HANDOVER_BATCH
        if urgent and not self._handover_soon:
            self._handover_soon = True
            self._loop.call_soon(self._hand_over)
        elif self._handover_timer is None:
            self._handover_timer = self._loop.call_later(HANDOVER_INTERVAL, self._hand_over)

    def _hand_over(self) -> None:
        self._handover_soon = False
        if self._handover_timer is not None:
            self._handover_timer.cancel()
            self._handover_timer = None
        turn, self._turn = self._turn, []
        if turn:
            self._queue.put(turn)

    # -- writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            while len(batch) < MAX_BATCH:
                try:
                    batch.extend(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._taken += len(batch)
            with self._lock:
                self._busy_since = time.monotonic()
            try:
                stop = self._handle(batch)
            except Exception:  # a bug here must not leave durable callers without an answer forever
                logger.exception("audit log %s: writer failed", self.path)
                self._fail("internal error in the audit writer")
                stop = False
            with self._lock:
                self._busy_since = None
            if stop:
                return

    def _handle(self, batch: list[_Item]) -> bool:
        """Write a batch in order, one write and one fsync per run of records; True once told to stop."""
        run: list[_Record] = []
        for item in batch:
            if isinstance(item, _Record):
                run.append(item)
                continue
            if run:
                self._write(run)
                run = []
            if isinstance(item, _Flush):
                self._unsynced.append(item)
            else:
                self._sync()
                if isinstance(item, _Stop):
                    self._close_fd()
                    self._settle(item.done, None)
                    return True
                self._open()
                self._settle(item.done, None if self._fd is not None else self._last_error)
        if run:
            self._write(run)
        self._sync()
        return False

    def _write(self, run: list[_Record]) -> None:
        """Write consecutive records with one system call; they succeed or fail together."""
        if self._fd is None and time.monotonic() - self._last_open >= REOPEN_RETRY_INTERVAL:
            self._open()
        if self._fd is None:
            reason = self._last_error or "audit file is not open"
            self._lose(len(run), reason)
            for item in run:
                self._settle(item.done, reason)
            return
        run = self._within_reserve(self._fd, run)
        if not run:
            return
        first = self._seq + 1
        data = b"".join([b'{"seq":%d,"time":"%s"' % (first + n, item.stamp.encode()) + item.body
                         for n, item in enumerate(run)])
        try:
            _write_all(self._fd, data)
        except OSError as exc:
            # Counted and answered with the others that now cannot be synced.
            self._unsynced.extend(item for item in run)
            self._fail(f"write failed: {_describe(exc)}")
            return
        self._space.wrote(len(data))
        with self._lock:
            self._seq = first + len(run) - 1
            self._written += len(run)
        if self._broken:
            self._broken = False
            logger.warning("audit log %s is writable again", self.path)
        self._unsynced.extend(item for item in run if item.done is not None)

    def _within_reserve(self, fd: int, run: list[_Record]) -> list[_Record]:
        """The records of `run` to write: all of them, or while free space is below the reserve only the durable
        ones."""
        low = self._space.low(fd)
        if low != self._space_low:
            self._space_changed(low)
        with self._lock:
            self._free_bytes = self._space.free
        if not low:
            return run
        kept = [item for item in run if item.done is not None]
        if len(kept) < len(run):
            dropped = len(run) - len(kept)
            self._dropped_in_episode += dropped
            with self._lock:
                self._failed += dropped
                self._dropped_for_space += dropped
        return kept

    def _space_changed(self, low: bool) -> None:
        """Say once that ordinary records stop for want of space, and once that they resume."""
        free, reserve = _size(self._space.free), _size(self._space.reserve)
        with self._lock:
            self._space_low = low
            if low:
                self._last_error = f"{free} free on the audit file system, less than the reserve of {reserve}"
        if low:
            logger.error("audit log %s: %s free on its file system, less than the reserve of %s "
                         "(audit_reserve_bytes): ordinary records are dropped until space is freed; those of "
                         "dangerous and confirmed calls are still written", self.path, free, reserve)
        else:
            logger.warning("audit log %s: %s free again; ordinary records are written again (%d were dropped)",
                           self.path, free, self._dropped_in_episode)
            self._dropped_in_episode = 0

    def _sync(self) -> None:
        if not self._unsynced:
            return
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                self._fail(f"fsync failed: {_describe(exc)}")
                return
        reason = None if self._fd is not None else self._last_error
        for item in self._unsynced:
            self._settle(item.done, reason)
        self._unsynced.clear()

    def _open(self) -> None:
        assert self.path is not None
        self._close_fd()
        self._last_open = time.monotonic()
        try:
            # Read access only to look at the last byte (_start_on_fresh_line); O_APPEND keeps every write at the end.
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError as exc:
            self._fail(f"cannot open: {_describe(exc)}")
            return
        try:
            info = os.fstat(fd)
            _start_on_fresh_line(fd, info)
        except OSError as exc:
            os.close(fd)
            self._fail(f"cannot write: {_describe(exc)}")
            return
        _sync_directory(self.path.parent)
        self._fd = fd
        self._space.opened(fd, info)
        with self._lock:
            self._free_bytes = self._space.free
        if not self._broken:
            logger.info("audit log: %s", self.path)

    def _fail(self, reason: str) -> None:
        """The file is unusable: close it, fail what waits for an fsync, and say so loudly once."""
        self._close_fd()
        lost = sum(1 for item in self._unsynced if isinstance(item, _Record))
        for item in self._unsynced:
            self._settle(item.done, reason)
        self._unsynced.clear()
        self._last_open = time.monotonic()
        if not self._broken:
            self._broken = True
            logger.error("audit log %s unavailable: %s; calls that need a durable audit record are refused, "
                         "others go on unrecorded (fix it, then `kill -USR1` the daemon)", self.path, reason)
        if lost:
            self._lose(lost, reason)
        else:
            with self._lock:
                self._last_error = reason

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _settle(self, done: Done | None, reason: str | None) -> None:
        if done is None or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            self._loop.call_soon_threadsafe(_resolve, done, reason)


def _resolve(done: Done, reason: str | None) -> None:
    if not done.done():  # the waiter may have timed out or been cancelled
        done.set_result(reason)
