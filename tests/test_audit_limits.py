"""The audit log's own limits, on real files: fields a client controls are cut, and a disk reserve keeps room
for the records dangerous calls need (on a real, small tmpfs)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gatewayd.audit import FIELD_MAX_CHARS, RECORD_MAX_CHARS, SUMMARY_MAX_ITEMS, AuditLog
from gatewayd.errors import AUDIT_UNAVAILABLE, AuditUnavailable
from tests.daemon import FAULTSRV, python_command, write_config
from tests.stack import running_stack
from tests.test_audit import read_records
from tests.waiting import eventually

MIB = 1024 * 1024
# What the test asks of a record whose client-chosen fields are megabytes long.
SHORT_LINE = 4 * 1024

# The small file system the reserve tests fill, and the reserve they keep on it.
FS_SIZE = 4 * MIB
RESERVE = 1 * MIB
# Space the tests take up before starting and free later.
FILLER = 1 * MIB
# One ordinary record of about 2 KiB: a field no bound applies to, well under RECORD_MAX_CHARS.
PAYLOAD = "p" * 2000
# Records queued between flushes while filling: the writer may overshoot the reserve by about one such round.
ROUND = 16
# Plenty of rounds to fill FS_SIZE with PAYLOAD records, so a reserve that never engages fails the test.
MAX_ROUNDS = 4 * FS_SIZE // (ROUND * len(PAYLOAD))
# Seconds to see free space come back: the writer measures at least every SPACE_CHECK_INTERVAL (1 s).
RESUME_TIMEOUT = 10.0


@pytest.fixture
async def audit(tmp_path: Path) -> AsyncIterator[AuditLog]:
    log = AuditLog(tmp_path / "audit.jsonl")
    await log.start()
    yield log
    await log.close()


# -- bounded fields ------------------------------------------------------------------------


async def test_megabyte_method_and_request_id_leave_one_short_line(audit: AuditLog) -> None:
    assert audit.path is not None
    method, request_id = "calc." + "m" * (4 * MIB), "id-" + "i" * (4 * MIB)
    event = {"event": "decision", "client": "c", "session": "0123456789ab", "route": "direct", "method": method,
             "request_id": request_id, "trace_id": "0af7651916cd43dd8448eb211c80319c", "decision": "deny",
             "reason": "unknown", "params": {"a": 1}}
    await audit.record(event, durable=True)
    audit.queue(event)
    await audit.flush()
    data = audit.path.read_bytes()
    lines = data.split(b"\n")[:-1]
    assert len(lines) == 2 and all(len(line) < SHORT_LINE for line in lines)
    first, second = read_records(audit.path)
    assert first["method"] == method[:FIELD_MAX_CHARS] + f"…[{len(method) - FIELD_MAX_CHARS} more chars]"
    assert first["request_id"] == request_id[:FIELD_MAX_CHARS] + f"…[{len(request_id) - FIELD_MAX_CHARS} more chars]"
    assert first["method"].startswith("calc.mmm") and first["request_id"].startswith("id-iii")
    # Everything else is as given, in order.
    assert list(first) == ["seq", "time", *event]
    assert {k: v for k, v in first.items() if k not in ("seq", "time", "method", "request_id")} == {
        k: v for k, v in event.items() if k not in ("method", "request_id")}
    assert {**first, "seq": 0, "time": ""} == {**second, "seq": 0, "time": ""}
    assert event["method"] is method  # the caller's event is not changed


async def test_every_field_a_caller_reaches_is_cut(audit: AuditLog) -> None:
    assert audit.path is not None
    long = "x" * (FIELD_MAX_CHARS + 1)
    fields = ("method", "request_id", "trace_id", "client", "session")
    await audit.record(dict.fromkeys(fields, long), durable=True)
    [record] = read_records(audit.path)
    assert all(record[name] == "x" * FIELD_MAX_CHARS + "…[1 more chars]" for name in fields)


async def test_cut_fields_stay_safe_and_a_field_at_the_bound_is_whole(audit: AuditLog) -> None:
    assert audit.path is not None
    nasty = "\u2028\x1b\x85\ud800\n" * MIB  # the cut must not undo the escaping
    exact = "e" * FIELD_MAX_CHARS
    await audit.record({"method": nasty, "request_id": exact}, durable=True)
    data = audit.path.read_bytes()
    assert data.count(b"\n") == 1 and len(data) < 6 * FIELD_MAX_CHARS + SHORT_LINE
    [record] = read_records(audit.path)
    assert record["method"].startswith(nasty[:FIELD_MAX_CHARS]) and "more chars]" in record["method"]
    assert record["request_id"] == exact


async def test_request_ids_that_are_not_strings(audit: AuditLog) -> None:
    assert audit.path is not None
    big = 10**2000  # Python parses JSON integers up to 4300 digits
    nested: dict[str, Any] = {"token": "hunter2", **{f"k{n}": "v" * 100 for n in range(1000)}}
    for request_id in (big, 10**5000, nested, [list(range(100))] * 100, 17, -3, None, 1.5, True):
        await audit.record({"method": "calc.add", "request_id": request_id, "pad": "p" * FIELD_MAX_CHARS},
                           durable=False)
    await audit.flush()
    records = read_records(audit.path)
    ids: list[Any] = [r.get("request_id") for r in records]
    assert ids[0] == str(big)[:FIELD_MAX_CHARS] + f"…[{2001 - FIELD_MAX_CHARS} more chars]"
    # Longer than Python turns into text (so no JSON parser here made it): still a record, not a writer failure.
    assert ids[1] is None and "integer string conversion" in records[1]["error"]
    assert ids[2]["token"] == "[redacted]" and len(ids[2]) == SUMMARY_MAX_ITEMS + 1  # a summary
    assert isinstance(ids[3], list) and len(ids[3]) <= SUMMARY_MAX_ITEMS + 1
    assert ids[4:] == [17, -3, None, 1.5, True]
    assert all(len(json.dumps(r)) < 16 * 1024 for r in records)


async def test_a_record_too_long_anyway_is_written_as_its_summary(audit: AuditLog) -> None:
    assert audit.path is not None
    await audit.record({"event": "outcome", "method": "calc.add", "note": "n" * MIB,
                        "extra": {f"k{n}": "v" * 1000 for n in range(100)}}, durable=True)
    data = audit.path.read_bytes()
    assert data.count(b"\n") == 1 and len(data) < RECORD_MAX_CHARS
    [record] = read_records(audit.path)
    assert record["event"] == "outcome" and record["method"] == "calc.add"
    assert record["note"].startswith("nnnn") and record["note"].endswith("more chars]")
    assert record["summarized_from_chars"] > MIB


async def test_a_client_flooding_huge_method_names_writes_short_lines(tmp_path: Path) -> None:
    """The finding: a read-only client, within its rate, sending megabyte method names and ids (denied and
    unknown calls are recorded too)."""
    tokens = write_config(tmp_path, {"spy": python_command(str(FAULTSRV)) + '\nprotocol = "jsonrpc"\n[methods.echo]\n'},
                          '[roles.r]\nallow = ["spy.echo"]\n', {"c": ["r"]})
    trail = tmp_path / "audit.jsonl"
    body_budget = 3 * MIB  # under max_body_bytes (4 MiB)
    async with running_stack(tmp_path, audit_path=str(trail)) as (client, state):
        headers = {"Authorization": f"Bearer {tokens['c']}", "Content-Type": "application/json"}
        for n, method in enumerate(["spy." + "x" * (body_budget // 2), "other." + "y" * (body_budget // 2)]):
            body = {"jsonrpc": "2.0", "id": f"{n}-" + "i" * (body_budget // 2), "method": method, "params": {}}
            response = await client.post("/mcp", data=json.dumps(body), headers=headers)
            answer = json.loads(await response.text())
            assert answer["error"]["code"] < 0
        await state.audit.flush()
    data = trail.read_bytes()
    lines = data.split(b"\n")[:-1]
    assert len(data) < 4 * SHORT_LINE and all(len(line) < SHORT_LINE for line in lines)
    assert all(json.loads(line)["seq"] == n for n, line in enumerate(lines, 1))


# -- the disk reserve, on a real small file system ------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A FS_SIZE tmpfs of its own, unmounted after; skipped where this process may not mount."""
    mount = tmp_path / "fs"
    mount.mkdir()
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("needs mount(8) and umount(8) to make a small file system")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE},mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): {made.stderr.strip()}")
    try:
        yield mount
    finally:
        # Lazily if a failed test left a file open, so no mount outlives the test.
        if subprocess.run(["umount", str(mount)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def free_bytes(path: Path) -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def fill(path: Path, size: int) -> None:
    with path.open("wb") as out:
        out.write(b"\0" * size)


def audit_errors(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "gatewayd.audit" and r.levelno == level and text in r.getMessage()]


async def fill_until_dropping(log: AuditLog) -> int:
    """Queue ordinary records until the writer drops them; how many were queued."""
    for rounds in range(MAX_ROUNDS):
        for n in range(ROUND):
            log.queue({"event": "outcome", "n": rounds * ROUND + n, "params": PAYLOAD})
        await log.flush()
        if log.status()["space_low"]:
            return (rounds + 1) * ROUND
    raise AssertionError(f"ordinary records never stopped: {log.status()}")


async def test_ordinary_records_stop_at_the_reserve_and_the_dangerous_ones_still_fit(
    small_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gatewayd.audit")
    path, filler = small_fs / "audit.jsonl", small_fs / "filler"
    fill(filler, FILLER)
    log = AuditLog(path, reserve_bytes=RESERVE)
    await log.start()
    try:
        queued = await fill_until_dropping(log)
        # Stopped before the disk was full: the reserve is left, but for about one round of records.
        assert free_bytes(small_fs) > RESERVE - 2 * ROUND * len(PAYLOAD)
        status = log.status()
        assert status["healthy"] is True  # dangerous calls still run: nothing for /healthz to report
        assert status["reserve_bytes"] == RESERVE and status["free_bytes"] < RESERVE
        assert 0 < status["records_dropped_for_space"] == status["records_failed"] < queued
        assert "less than the reserve" in status["last_error"]

        size = path.stat().st_size
        for n in range(100):
            log.queue({"event": "outcome", "n": n, "params": PAYLOAD})
        await log.flush()
        assert path.stat().st_size == size
        assert log.status()["records_dropped_for_space"] == status["records_dropped_for_space"] + 100

        await log.record({"event": "decision", "decision": "allow", "method": "shell.run"}, durable=True)
        assert read_records(path)[-1]["method"] == "shell.run"
        assert len(audit_errors(caplog, logging.ERROR, "less than the reserve")) == 1  # once, not per record

        filler.unlink()

        def resumed() -> bool:
            log.queue({"event": "probe"})  # the writer looks at the disk again when it has records to write
            return not log.status()["space_low"]

        await eventually(resumed, timeout=RESUME_TIMEOUT, what="ordinary records resumed once space was freed")
        log.queue({"event": "outcome", "marker": "after"})
        await log.flush()
        records = read_records(path)
        assert records[-1]["marker"] == "after"
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1))  # no gaps among written records
        assert len(audit_errors(caplog, logging.WARNING, "written again")) == 1
        assert log.status()["healthy"] is True
    finally:
        await log.close()


async def test_a_disk_already_short_of_the_reserve_drops_ordinary_records_from_the_start(small_fs: Path) -> None:
    path = small_fs / "audit.jsonl"
    fill(small_fs / "filler", FS_SIZE - RESERVE // 2)
    log = AuditLog(path, reserve_bytes=RESERVE)
    await log.start()
    try:
        log.queue({"event": "decision", "decision": "allow"})
        await log.record({"event": "decision", "decision": "confirm"}, durable=True)
        log.queue({"event": "outcome"})
        await log.flush()
        assert [r["decision"] for r in read_records(path)] == ["confirm"]
        assert log.status()["records_dropped_for_space"] == 2
    finally:
        await log.close()


async def test_durable_records_use_the_reserve_to_the_end_then_refuse(small_fs: Path) -> None:
    path, filler = small_fs / "audit.jsonl", small_fs / "filler"
    fill(filler, FS_SIZE - RESERVE // 2)
    log = AuditLog(path, reserve_bytes=RESERVE)
    await log.start()
    try:
        written = 0
        with pytest.raises(AuditUnavailable) as caught:
            for _ in range(FS_SIZE // len(PAYLOAD)):
                await log.record({"event": "decision", "params": PAYLOAD}, durable=True)
                written += 1
        assert caught.value.code == AUDIT_UNAVAILABLE and "ENOSPC" in caught.value.data["reason"]
        assert written * len(PAYLOAD) > RESERVE // 4  # well into the reserve
        assert log.status()["healthy"] is False

        filler.unlink()
        log.reopen()
        await log.record({"event": "decision", "marker": "again"}, durable=True)
        # The record that met the full disk may be torn in the file; the next one starts on a fresh line.
        assert json.loads(path.read_bytes().splitlines()[-1])["marker"] == "again"
        assert log.status()["healthy"] is True
    finally:
        await log.close()


async def test_free_space_is_measured_only_with_a_reserve(tmp_path: Path) -> None:
    unreserved = AuditLog(tmp_path / "audit.jsonl")
    await unreserved.start()
    unreserved.queue({"event": "x"})
    await unreserved.flush()
    await unreserved.close()
    assert unreserved.status()["free_bytes"] is None and unreserved.status()["records_written"] == 1
    reserved = AuditLog(tmp_path / "reserved.jsonl", reserve_bytes=1)
    await reserved.start()
    await reserved.close()
    assert reserved.status()["free_bytes"] == pytest.approx(free_bytes(tmp_path), rel=0.01)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
async def test_the_reserve_ignores_files_that_are_not_regular() -> None:
    # No file system has this much free: on a regular file every ordinary record would be dropped for space.
    log = AuditLog(Path("/dev/full"), reserve_bytes=2**62)
    await log.start()
    log.queue({"event": "x"})
    await log.flush()
    await log.close()
    status = log.status()
    assert status["free_bytes"] is None and status["space_low"] is False
    assert status["records_dropped_for_space"] == 0 and status["records_failed"] == 1
    assert "ENOSPC" in status["last_error"]
