"""Cutting a child's stdout into lines as the pipe delivers it: any chunking, the size limit, EOF."""

from __future__ import annotations

from gatewayd.upstream.peer import answered_id
from gatewayd.upstream.process import MAX_LINE_BYTES, OVERLONG_HEAD_BYTES, OVERLONG_TAIL_BYTES, Line, Lines


class Collector:
    """What a `Lines` hands on: every line, and the lines that were too long (their heads, and tails once ended)."""

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.calls = 0
        self.overlong = 0
        self.heads: list[bytes] = []
        self.ended: list[tuple[bytes, bytes]] = []
        self.splitter = Lines(self.take, self.too_long)

    def take(self, lines: list[Line]) -> None:
        self.calls += 1
        self.lines.extend(lines)

    def too_long(self, head: bytes, tail: bytes | None) -> None:
        if tail is None:
            self.overlong += 1
            self.heads.append(head)
        else:
            # Told again once the line ends, with the same head.
            assert head == self.heads[-1] and len(self.ended) == self.overlong - 1
            self.ended.append((head, tail))


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
    # Each is told with its head (what says which call it answered): the line's first bytes, however it came in.
    assert out.overlong == 2 and out.heads == [b"x" * OVERLONG_HEAD_BYTES, (b"start" + chunk)[:OVERLONG_HEAD_BYTES]]
    assert [tail for _, tail in out.ended] == [b"x" * OVERLONG_TAIL_BYTES, (chunk + b"tail")[-OVERLONG_TAIL_BYTES:]]


async def test_an_overlong_line_s_head_spans_the_reads_it_came_in() -> None:
    # A child that flushed the line's start apart from the rest: its id is in the second read.
    out = Collector()
    start = b'{"jsonrpc":"2.0",'
    rest = b'"id":7,"result":"' + b"x" * MAX_LINE_BYTES
    out.splitter.feed(start)
    out.splitter.feed(rest)
    out.splitter.feed(b'"}\nafter\n')
    assert out.heads == [(start + rest)[:OVERLONG_HEAD_BYTES]] and out.lines == [b"after"]


async def test_an_overlong_last_line_is_not_handed_on_at_eof() -> None:
    out = Collector()
    out.splitter.feed(b"z" * (MAX_LINE_BYTES + 1))
    out.splitter.eof()
    assert out.lines == [] and out.overlong == 1 and out.ended == []


async def test_an_overlong_line_s_tail_spans_the_reads_it_came_in() -> None:
    # Ended in the read that crosses the limit, in the read after it, or in one with only its last bytes.
    end = b',"id":9}'
    body = b'{"jsonrpc":"2.0","result":"' + b"x" * MAX_LINE_BYTES + b'"'
    for cut in (len(body) + 3, len(body) - 100, MAX_LINE_BYTES - 10):
        out = Collector()
        line = body + end
        out.splitter.feed(line[:cut])
        out.splitter.feed(line[cut:cut + 5])
        out.splitter.feed(line[cut + 5:] + b"\nnext\n")
        assert out.lines == [b"next"] and out.overlong == 1, cut
        assert out.ended == [(line[:OVERLONG_HEAD_BYTES], line[-OVERLONG_TAIL_BYTES:])], cut


def test_the_head_of_an_answer_names_its_call_only_when_it_is_the_top_level_object() -> None:
    from gatewayd.upstream.peer import _ANSWER_HEAD

    def named(head: bytes) -> int | None:
        match = _ANSWER_HEAD.match(head)
        return int(match.group(1)) if match else None

    assert named(b'{"jsonrpc":"2.0","id":17,"result":"xxxx') == 17
    assert named(b'{ "id": 3, "jsonrpc": "2.0", "error": {"code"') == 3
    assert named(b'{"id":8,"result":"xxxx') == 8
    # Anything else could be a nested "id", a notification, or an id the gateway never sends: not guessed.
    for head in (b'{"result":{"jsonrpc":"2.0","id":5,"result":1', b'{"jsonrpc":"2.0","method":"x","params":{"id":5',
                 b'{"jsonrpc":"2.0","id":"abc","result":', b'{"jsonrpc":"2.0","id":5}', b"xxxx"):
        assert named(head) is None, head


def test_a_response_s_id_at_its_end_names_its_call_once_the_line_has_ended() -> None:
    head = b'{"jsonrpc":"2.0","result":"xxxx'
    assert answered_id(head, b'xxxx","id":12}') == 12
    assert answered_id(b'{ "error": {"code": -1, "message": "xx', b'xx"} , "id" : 4 }\r') == 4
    # Not before its end is known, and never when the id could be another object's or the line is no response: a
    # nested object's last member, a child's own request, an id inside a string, an id the gateway never sends.
    assert answered_id(head, None) is None
    unsure = ((head, b'xxxx","more":{"id":12}}'), (b'{"jsonrpc":"2.0","method":"x","params":{"a":"', b'","id":12}'),
              (head, b'xx \\",\\"id\\":12}"}'), (head, b'xxxx","id":"12"}'), (b"xxxx", b',"id":12}'))
    for first, last in unsure:
        assert answered_id(first, last) is None, (first, last)


def test_a_response_whose_id_is_neither_first_nor_last_answers_the_only_call_waiting() -> None:
    head, tail = b'{"result":"xxxx', b'xxxx","id":7,"jsonrpc":"2.0"}'
    assert answered_id(head, tail) is None  # several calls wait: which one it answers is not known
    assert answered_id(head, tail, only=3) == 3  # one alone: a response answers it (the child's id is its own)
    # Not before the line has ended, nor for what is no response, and an id the line does give wins.
    assert answered_id(head, None, only=3) is None
    assert answered_id(b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"', b'"}}', only=3) is None
    assert answered_id(head, b'xxxx","id":12}', only=3) == 12
