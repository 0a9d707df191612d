"""Cutting a child's stdout into lines as the pipe delivers it: any chunking, the size limit, EOF."""

from __future__ import annotations

from gatewayd.upstream.process import MAX_LINE_BYTES, Lines


class Collector:
    """What a `Lines` hands on: every line, and how many were too long."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.calls = 0
        self.overlong = 0
        self.splitter = Lines(self.take, self.too_long)

    def take(self, lines: list[bytes]) -> None:
        self.calls += 1
        self.lines.extend(lines)

    def too_long(self) -> None:
        self.overlong += 1


async def test_lines_arrive_whole_whatever_the_chunks() -> None:
    stream = b'{"id":1}\n{"id":2}\r\n\n{"id":"three"}\n'
    for size in (1, 2, 3, 7, len(stream)):
        out = Collector()
        for start in range(0, len(stream), size):
            out.splitter.feed(stream[start:start + size])
        assert out.lines == [b'{"id":1}', b'{"id":2}\r', b"", b'{"id":"three"}'], size
        assert not out.splitter.closed.done()


async def test_lines_of_one_chunk_are_handed_on_together() -> None:
    out = Collector()
    out.splitter.feed(b"a\nb\nc")
    assert (out.lines, out.calls) == ([b"a", b"b"], 1)


async def test_a_last_line_without_newline_counts_at_eof() -> None:
    out = Collector()
    out.splitter.feed(b"a\npartial")
    out.splitter.eof()
    assert out.lines == [b"a", b"partial"]
    assert out.splitter.closed.done()


async def test_a_line_at_the_limit_passes() -> None:
    out = Collector()
    line = b"x" * MAX_LINE_BYTES
    out.splitter.feed(line[:1000])
    out.splitter.feed(line[1000:] + b"\n")
    out.splitter.feed(line + b"\n")
    assert [len(line) for line in out.lines] == [MAX_LINE_BYTES, MAX_LINE_BYTES] and out.overlong == 0


async def test_an_overlong_line_is_dropped_to_its_newline_in_one_chunk_or_many() -> None:
    out = Collector()
    out.splitter.feed(b"x" * (MAX_LINE_BYTES + 1) + b"\nnext\n")
    chunk = b"y" * (MAX_LINE_BYTES // 4)
    out.splitter.feed(b"start")
    for _ in range(5):  # crosses the limit while no newline has come: nothing more is kept
        out.splitter.feed(chunk)
    out.splitter.feed(b"tail\nafter\nlast")
    out.splitter.eof()
    assert out.lines == [b"next", b"after", b"last"]
    assert out.overlong == 2


async def test_an_overlong_last_line_is_not_handed_on_at_eof() -> None:
    out = Collector()
    out.splitter.feed(b"z" * (MAX_LINE_BYTES + 1))
    out.splitter.eof()
    assert out.lines == [] and out.overlong == 1
