"""The audit log on real files: one line per record, order, durability, broken disks, rotation, helpers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gatewayd import audit as audit_module
from gatewayd.audit import (
    FIELD_MAX_CHARS,
    REDACTED,
    SUMMARY_MAX_ITEMS,
    SUMMARY_MAX_STRING,
    TOO_DEEP,
    AuditLog,
    _Summary,
    params_hash,
    summarize,
    trace_id,
)
from gatewayd.errors import AUDIT_UNAVAILABLE, AuditUnavailable
from tests.waiting import eventually

RFC3339_MS_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
DEV_FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not DEV_FULL.exists(), reason="needs /dev/full")
# Far more than a pipe holds, so a writer with no reader blocks like a hung disk.
PIPE_FILL = 4 * 1024 * 1024
# Records that big are written whole (a longer one would be summarized): PIPE_FILL takes many of them.
BLOB = 32 * 1024
# Strings that would split, forge or disguise a log line if written raw.
NASTY = [
    "calc.add\n{\"seq\":999,\"forged\":true}",
    "a\rb",
    "\r\n",
    "\x1b[31mred\x1b[0m\x1b]0;title\x07",
    "\x9b31m",  # 8-bit CSI
    "line\u2028sep\u2029para",
    "nel\x85",
    "\x0b\x0c\x1c\x1d\x1e",
    "\u202etxt.exe",
    "\x00nul",
    "lone \ud800 surrogate",
    "x" * FIELD_MAX_CHARS,  # the longest method written whole (tests/test_audit_limits.py: longer ones)
]


@pytest.fixture
async def audit(tmp_path: Path) -> AsyncIterator[AuditLog]:
    log = AuditLog(tmp_path / "audit.jsonl")
    await log.start()
    yield log
    await log.close()


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record in the file; fails unless each is exactly one line by every splitting rule."""
    data = path.read_bytes()
    assert data.endswith(b"\n") or not data
    lines = data.split(b"\n")[:-1]
    text = data.decode("utf-8")
    # str.splitlines() also breaks at \r, \x0b, \x0c, \x1c-\x1e, \x85, U+2028 and U+2029.
    assert len(text.splitlines()) == len(lines)
    return [json.loads(line) for line in lines]


# -- records ---------------------------------------------------------------------------------


async def test_records_are_single_lines_with_seq_in_order(audit: AuditLog) -> None:
    assert audit.path is not None
    for n in range(5):
        await audit.record({"event": "decision", "n": n}, durable=n % 2 == 0)
    await audit.flush()
    records = read_records(audit.path)
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["n"] for r in records] == [0, 1, 2, 3, 4]
    assert all(RFC3339_MS_UTC.fullmatch(r["time"]) for r in records)
    assert list(records[0])[:2] == ["seq", "time"]
    assert audit.status() == {
        "path": str(audit.path), "enabled": True, "healthy": True, "last_error": None,
        "records_written": 5, "records_failed": 0, "seq": 5,
        "space_low": False, "free_bytes": None, "reserve_bytes": 0, "records_dropped_for_space": 0,
    }


async def test_an_event_cannot_set_seq_or_time(audit: AuditLog) -> None:
    assert audit.path is not None
    await audit.record({"seq": 999, "time": "1970-01-01T00:00:00.000Z", "event": "x"}, durable=True)
    [record] = read_records(audit.path)
    assert record["seq"] == 1
    assert record["time"] != "1970-01-01T00:00:00.000Z"
    assert audit.path.read_bytes().count(b'"seq"') == 1


async def test_durable_record_is_in_the_file_when_record_returns(audit: AuditLog) -> None:
    assert audit.path is not None
    await audit.record({"event": "exec_start", "method": "shell.run"}, durable=True)
    [record] = read_records(audit.path)
    assert record["method"] == "shell.run"


async def test_file_is_private(audit: AuditLog) -> None:
    assert audit.path is not None
    assert stat.S_IMODE(audit.path.stat().st_mode) & 0o077 == 0


async def test_concurrent_records_keep_call_order(audit: AuditLog) -> None:
    assert audit.path is not None
    called: list[int] = []

    async def one(n: int) -> None:
        called.append(n)  # nothing awaits between this and record() queueing its line
        await audit.record({"n": n}, durable=n % 3 == 0)

    async with asyncio.timeout(30):
        await asyncio.gather(*(one(n) for n in range(300)))
        await audit.flush()
    records = read_records(audit.path)
    assert [r["n"] for r in records] == called
    assert [r["seq"] for r in records] == list(range(1, 301))


async def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"seq":1,"time":"2025-01-01T00:00:00.000Z","ev')  # a crash mid-write
    log = AuditLog(path)
    await log.start()
    await log.record({"event": "after"}, durable=True)
    await log.close()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    assert json.loads(lines[1])["event"] == "after"


async def test_disabled_log_accepts_everything_and_writes_nothing(tmp_path: Path) -> None:
    log = AuditLog(None)
    await log.start()
    await log.record({"event": "x"}, durable=True)
    await log.record({"event": "y"}, durable=False)
    log.reopen()
    await log.flush()
    await log.close()
    assert log.status()["healthy"] is True
    assert log.status()["enabled"] is False
    assert os.listdir(tmp_path) == []


async def test_queued_records_keep_their_order_among_durable_ones(audit: AuditLog) -> None:
    assert audit.path is not None
    audit.queue({"n": 1})
    await audit.record({"n": 2}, durable=True)
    audit.queue({"n": 3})
    await audit.flush()
    assert [(r["seq"], r["n"]) for r in read_records(audit.path)] == [(1, 1), (2, 2), (3, 3)]


async def test_queueing_before_start_or_after_close_counts_the_record_as_failed(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.queue({"event": "early"})
    await log.start()
    await log.close()
    log.queue({"event": "late"})
    assert log.status()["records_failed"] == 2


async def test_after_close_durable_records_are_refused(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    await log.start()
    await log.close()
    with pytest.raises(AuditUnavailable):
        await log.record({"event": "late"}, durable=True)
    await log.record({"event": "late"}, durable=False)
    assert log.status()["records_failed"] == 1


# -- injection safety ----------------------------------------------------------------------


async def test_nasty_strings_stay_on_one_line_and_round_trip(audit: AuditLog) -> None:
    assert audit.path is not None
    for text in NASTY:
        await audit.record({"method": text, "params": {text: text}, "summary": summarize({"arg": text})},
                           durable=False)
    await audit.flush()
    data = audit.path.read_bytes()
    assert data.count(b"\n") == len(NASTY)
    for raw in (b"\r", b"\x1b", b"\x00", b"\xc2\x85", b"\xc2\x9b", "\u2028".encode(), "\u202e".encode()):
        assert raw not in data
    records = read_records(audit.path)
    assert [r["method"] for r in records] == NASTY
    assert [r["params"] for r in records] == [{text: text} for text in NASTY]
    assert [r["seq"] for r in records] == list(range(1, len(NASTY) + 1))


async def test_values_that_are_not_json_still_leave_a_record(audit: AuditLog) -> None:
    assert audit.path is not None
    looped: dict[str, Any] = {}
    looped["self"] = looped
    await audit.record({"path": Path("/x"), "ratio": float("nan")}, durable=True)
    await audit.record({"loop": looped}, durable=True)
    first, second = read_records(audit.path)
    assert "unencodable_event" in first and "unencodable_event" in second
    assert [first["seq"], second["seq"]] == [1, 2]


# -- broken disks --------------------------------------------------------------------------


@needs_dev_full
async def test_durable_record_on_a_full_disk_raises_audit_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    log = AuditLog(DEV_FULL)
    await log.start()
    try:
        with pytest.raises(AuditUnavailable) as caught:
            await log.record({"event": "exec_start", "method": "shell.run"}, durable=True)
    finally:
        await log.close()
    error = caught.value
    assert error.code == AUDIT_UNAVAILABLE == -32013
    assert "path" not in error.data  # the server's file layout is not the caller's business
    assert "ENOSPC" in error.data["reason"]
    wire = error.to_wire()
    assert wire["data"]["error_type"] == "audit_unavailable"
    assert wire["data"]["retryable"] is True
    status = log.status()
    assert status["healthy"] is False
    assert "ENOSPC" in status["last_error"]
    assert status["records_failed"] == 1
    assert status["seq"] == 0
    assert any(r.levelno == logging.ERROR and str(DEV_FULL) in r.getMessage() for r in caplog.records)


@needs_dev_full
async def test_ordinary_records_on_a_full_disk_are_counted_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    log = AuditLog(DEV_FULL)
    await log.start()
    for n in range(100):
        await log.record({"n": n}, durable=False)
    await log.flush()
    status = log.status()
    await log.close()
    assert status["records_failed"] == 100
    assert status["records_written"] == 0
    # Loud, but rate-limited: the outage and one count, not a line per record.
    errors = [r for r in caplog.records if r.name == "gatewayd.audit" and r.levelno == logging.ERROR]
    assert 1 <= len(errors) <= 4


async def test_unopenable_path_leaves_the_log_unhealthy_until_reopened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file where a directory should be")
    path = blocker / "audit.jsonl"  # ENOTDIR, even for root
    log = AuditLog(path)
    await log.start()  # must not raise
    try:
        status = log.status()
        assert status["healthy"] is False
        assert "ENOTDIR" in status["last_error"]
        assert any(r.levelno == logging.ERROR and str(path) in r.getMessage() for r in caplog.records)
        with pytest.raises(AuditUnavailable) as caught:
            await log.record({"event": "exec_start"}, durable=True)
        assert caught.value.data == {"reason": status["last_error"]}
        await log.record({"event": "decision"}, durable=False)
        await log.flush()
        assert log.status()["records_failed"] == 2

        blocker.unlink()
        blocker.mkdir()
        log.reopen()
        await log.flush()
        assert log.status()["healthy"] is True
        await log.record({"event": "exec_start"}, durable=True)
        assert [r["seq"] for r in read_records(path)] == [1]
    finally:
        await log.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
async def test_read_only_directory_leaves_the_log_unhealthy(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o500)
    try:
        log = AuditLog(tmp_path / "audit.jsonl")
        await log.start()
        with pytest.raises(AuditUnavailable):
            await log.record({"event": "exec_start"}, durable=True)
        await log.close()
        assert "EACCES" in log.status()["last_error"]
    finally:
        os.chmod(tmp_path, 0o700)


async def test_a_stuck_disk_refuses_durable_records_in_bounded_time(tmp_path: Path) -> None:
    fifo = tmp_path / "audit.fifo"
    os.mkfifo(fifo)
    log = AuditLog(fifo, write_timeout=0.2)
    await log.start()  # the writer holds the FIFO open read-write, so nothing blocks yet
    reader = os.open(fifo, os.O_RDONLY)
    try:
        # Nobody reads the pipe yet: the writer blocks mid-write, as on a hung disk.
        for _ in range(PIPE_FILL // BLOB):
            log.queue({"blob": "x" * BLOB})
        async with asyncio.timeout(10):
            with pytest.raises(AuditUnavailable) as caught:
                await log.record({"method": "shell.run"}, durable=True)
        assert "did not answer" in caught.value.data["reason"]
        await eventually(lambda: not log.status()["healthy"], what="stuck writer reported unhealthy")
    finally:
        async with asyncio.timeout(30):
            await asyncio.to_thread(_read_until, reader, b'"method":"shell.run"}\n')
            await log.close()
        os.close(reader)


def _read_until(fd: int, marker: bytes) -> None:
    tail = b""
    while marker not in tail:
        chunk = os.read(fd, 1 << 16)
        assert chunk, "writer closed before the marker"
        tail = (tail + chunk)[-len(marker) - (1 << 16):]


# -- rotation ------------------------------------------------------------------------------


async def test_reopen_after_rename_starts_a_new_file_at_the_same_path(audit: AuditLog) -> None:
    assert audit.path is not None
    await audit.record({"n": 1}, durable=True)
    await audit.record({"n": 2}, durable=True)
    rotated = audit.path.with_name("audit.jsonl.1")
    audit.path.rename(rotated)
    await audit.record({"n": 3}, durable=False)  # queued before the reopen: still the old file
    audit.reopen()
    await audit.record({"n": 4}, durable=True)
    assert [(r["seq"], r["n"]) for r in read_records(rotated)] == [(1, 1), (2, 2), (3, 3)]
    assert [(r["seq"], r["n"]) for r in read_records(audit.path)] == [(4, 4)]
    assert stat.S_IMODE(audit.path.stat().st_mode) & 0o077 == 0
    assert audit.status()["healthy"] is True


# -- helpers -------------------------------------------------------------------------------


def test_params_hash_ignores_key_order() -> None:
    a = {"b": 1, "a": {"y": [1, 2, {"q": None, "p": "é"}], "x": True}}
    b = {"a": {"x": True, "y": [1, 2, {"p": "é", "q": None}]}, "b": 1}
    assert params_hash(a) == params_hash(b)
    assert re.fullmatch(r"[0-9a-f]{64}", params_hash(a))


def test_params_hash_tells_values_apart() -> None:
    assert params_hash({"a": 1}) != params_hash({"a": 2})
    assert params_hash([1, 2]) != params_hash([2, 1])
    assert params_hash({"a": "1"}) != params_hash({"a": 1})
    assert params_hash(None) != params_hash({})
    assert params_hash("lone \ud800") != params_hash("lone \ud801")


def _canonical_sha256(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@pytest.mark.parametrize("size", [100, audit_module.LARGE_HASH_BYTES + 1, 3 * audit_module.LARGE_HASH_BYTES])
def test_params_hash_is_the_same_digest_on_both_sides_of_the_large_limit(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = {"z": ["é\ud800\"\n" + "x" * size], "a": 1}  # a canonical form under the limit, then over it
    assert params_hash(value) == _canonical_sha256(value)
    # And where this Python has no OpenSSL: Python's own SHA-256.
    audit_module._large_sha256.cache_clear()
    monkeypatch.setitem(sys.modules, "_hashlib", None)
    try:
        assert params_hash(value) == _canonical_sha256(value)
    finally:
        audit_module._large_sha256.cache_clear()


def test_params_hash_of_large_arguments_is_their_canonical_json_s_digest() -> None:
    big = audit_module.LARGE_HASH_BYTES * 5  # past jsontext.LARGE_STRING too: made from the string's bytes
    escaped = "é\ud800\"\\\n\t" * 10
    values: list[Any] = [
        {"content": "x" * big},
        {"z": {"b": ["y" * big, 1.5, float("nan"), None, True], "a": {"q": escaped * 3}}, "a": [2, {"k": "v"}]},
        ["w" * big + escaped, escaped + "w" * big, -7, 10**30],
        {"numbered": {2: "a", 1: "b" * big}},  # keys that are no strings: that part encoded whole, as before
        {"text": "v" * big, "tags": ["t"] * 70},  # the look's budget spent before the large string: whole
        "s" * big,
    ]
    for value in values:
        assert params_hash(value) == _canonical_sha256(value)
    # A caller that knows the arguments are flat (summarize(params) is params) skips the look: same digest.
    flat = {"a": 1, "b": "short"}
    assert params_hash(flat, True) == params_hash(flat) == _canonical_sha256(flat)


@pytest.mark.parametrize(
    "key",
    ["password", "PASSWORD", "db_passwd", "token", "access_token", "refreshToken", "client_secret", "api_key",
     "apiKey", "X-Api-Key", "Authorization", "Cookie", "set-cookie", "credentials", "private_key", "privateKey"],
)
def test_summarize_redacts_secret_looking_keys(key: str) -> None:
    summary = summarize({key: {"nested": "hunter2"}, "path": "/tmp/x"})
    assert summary == {key: REDACTED, "path": "/tmp/x"}


def test_summarize_redacts_at_any_depth() -> None:
    params = {"headers": [{"name": "x", "Authorization": "Bearer abc"}], "env": {"GITHUB_TOKEN": "ghp_x"}}
    summary = summarize(params)
    assert summary == {"headers": [{"name": "x", "Authorization": REDACTED}], "env": {"GITHUB_TOKEN": REDACTED}}
    assert "abc" not in json.dumps(summary) and "ghp_x" not in json.dumps(summary)
    assert params["env"] == {"GITHUB_TOKEN": "ghp_x"}  # the input is untouched


def test_summarize_cuts_long_strings_saying_how_much() -> None:
    summary = summarize({"text": "y" * (SUMMARY_MAX_STRING + 50), "short": "ok"})
    assert summary["text"] == "y" * SUMMARY_MAX_STRING + "…[50 more chars]"
    assert summary["short"] == "ok"


def test_summarize_cuts_lists_and_objects() -> None:
    many = SUMMARY_MAX_ITEMS + 5
    assert summarize(list(range(many))) == [*range(SUMMARY_MAX_ITEMS), "…[5 more items]"]
    cut = summarize({f"k{n}": n for n in range(many)})
    assert len(cut) == SUMMARY_MAX_ITEMS + 1
    assert cut["…"] == "[5 more keys]"


def test_summarize_bounds_depth() -> None:
    assert summarize({"a": {"b": {"c": {"d": {"e": 1}}}}}) == {"a": {"b": {"c": {"d": TOO_DEEP}}}}
    assert summarize([[[[[1]]]]]) == [[[[TOO_DEEP]]]]


def test_summarize_keeps_long_keys_apart() -> None:
    summary = summarize({"k" * 500 + "1": 1, "k" * 500 + "2": 2})
    assert sorted(summary.values()) == [1, 2]
    assert all(len(key) < 100 for key in summary)


def test_summarize_stays_small_whatever_the_input() -> None:
    wide = {("k" * 1000 + str(i)): {str(j): ["v" * 10_000] * 100 for j in range(100)} for i in range(100)}
    deep: Any = "x"
    for _ in range(60):
        deep = [deep, deep]
    for params in (wide, deep, [["z" * 100_000] * 100] * 100):
        assert len(json.dumps(summarize(params), ensure_ascii=False)) < 16 * 1024


def test_summarize_makes_any_value_json() -> None:
    summary = summarize({"nan": float("nan"), "inf": float("-inf"), "obj": object(), "t": (1, 2)})
    assert summary == {"nan": "nan", "inf": "-inf", "obj": "<object>", "t": [1, 2]}
    json.dumps(summary, allow_nan=False)


@pytest.mark.parametrize(
    "params",
    [
        None, {}, {"a": 1, "b": "two", "c": True, "d": None, "e": 1.5, "f": 10**30},
        {"s": "x" * SUMMARY_MAX_STRING, "k" * 64: 0},
        # Each of these needs the full walk: something is cut, redacted, made JSON or nested.
        {"api_key": "k"}, {"a": "x" * (SUMMARY_MAX_STRING + 1)}, {"k" * 65: 1},
        {str(n): n for n in range(SUMMARY_MAX_ITEMS + 1)}, {"a": float("nan")}, {"a": {"b": 1}}, {"a": [1]},
        {1: "not a str key"}, {"t": (1, 2)}, [1, "two"], "text", 7,
    ],
)
def test_summarize_skips_the_walk_only_where_it_would_change_nothing(params: Any) -> None:
    walked = _Summary().value(params, 0)
    summary = summarize(params)
    assert summary == walked
    if summary is params:
        assert json.loads(json.dumps(params)) == params


VALID_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    "meta",
    [
        {"traceparent": f"00-{VALID_TRACE}-00f067aa0ba902b7-01"},
        {"traceparent": f"00-{VALID_TRACE}-00f067aa0ba902b7-00", "progressToken": 1},
    ],
)
def test_trace_id_comes_from_a_valid_traceparent(meta: dict[str, Any]) -> None:
    assert trace_id(meta) == VALID_TRACE


@pytest.mark.parametrize(
    "meta",
    [
        None,
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        {},
        {"traceparent": 7},
        {"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"},  # all-zero trace id
        {"traceparent": f"00-{VALID_TRACE}-{'0' * 16}-01"},  # all-zero parent id
        {"traceparent": f"00-{VALID_TRACE.upper()}-00f067aa0ba902b7-01"},
        {"traceparent": f"ff-{VALID_TRACE}-00f067aa0ba902b7-01"},
        {"traceparent": f"00-{VALID_TRACE}-00f067aa0ba902b7-01\n"},
        {"traceparent": f"00-{VALID_TRACE}-00f067aa0ba902b7"},
        {"traceparent": f"00-{VALID_TRACE[:-1]}-00f067aa0ba902b7-01"},
        {"traceparent": f" 00-{VALID_TRACE}-00f067aa0ba902b7-01"},
    ],
)
def test_trace_id_is_fresh_without_a_valid_traceparent(meta: Any) -> None:
    first, second = trace_id(meta), trace_id(meta)
    assert re.fullmatch(r"[0-9a-f]{32}", first)
    assert first != second
    assert VALID_TRACE not in (first, second)
