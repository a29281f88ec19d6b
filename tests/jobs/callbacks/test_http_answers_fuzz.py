"""Hypothesis against the callback client (jobs.callbacks.http): a real loopback server sends odd but
valid answers (interim 1xx, chunked with odd sizes, extensions and trailers, close-delimited,
HTTP/1.0, bodies around MAX_BODY, dripped in pieces) and broken ones (truncated anywhere, closed
early, garbage, huge or endless headers and trailers).

Each case must settle as an answer (delivered or a failed attempt by status) or as one of the
errors the dispatcher records (``jobs.push.dispatcher.Engine._deliver``), within the deadline,
with no exception escaping into the event loop; and the keep-alive pool must hold a connection
only after a complete keep-alive answer: a second, plain request to the same server must get its
own answer, on the same connection exactly when the first answer allowed reuse. DB-free.
"""

from __future__ import annotations

import asyncio
import socket
import string
import threading
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.callbacks.http import MAX_BODY, MAX_HEAD, Client, ProtocolError
from tests.helpers import LoopbackServer
from tests.jobs.callbacks.rawhttp import request_read

GOOD = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Good: 1\r\n\r\ngood"
TIMEOUT = 2.0  # deadline of an attempt whose answer ends (by its framing or by a close)
HANG_TIMEOUT = 0.3  # deadline of an attempt whose server stops sending but keeps the connection
SLACK = 1.5  # seconds an attempt may take beyond its deadline on a busy 2-core machine


@dataclass
class Plan:
    """What the server sends for the first request on a connection, and what the client must make of it."""

    data: bytes
    head_end: int = 0  # where the final answer's body starts in ``data``
    status: int = 0
    headers: dict = field(default_factory=dict)  # the final answer's headers as the client must report them
    body: bytes = b""
    framing: str = "none"  # none (204/304), length, chunked, close
    reusable: bool = False  # the client may keep the connection after this answer
    segments: list = field(default_factory=list)  # (bytes, pause before sending) for a drip
    end: str = "keep"  # after sending: keep (serve the next request), close, hang


class ScriptServer(LoopbackServer):
    """One loopback server for a whole test: each connection's first request that is not
    ``X-Case: good`` gets the current plan, every other request gets ``GOOD``."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self.release = threading.Event()
        self.good_on_odd: list[bool] = []  # per plain request: did it come on the odd request's connection
        super().__init__()

    def reset(self, plan: Plan) -> None:
        self.release.set()  # let the previous example's hanging connections go
        self.release = threading.Event()
        self.plan, self.connections, self.good_on_odd = plan, 0, []

    def serve_args(self) -> tuple:
        return self.plan, self.release

    def serve(self, conn: socket.socket, plan: Plan, release: threading.Event) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf, odd_seen = b"", False
        try:
            while (read := request_read(conn, buf)) is not None:
                request, buf = read
                if b"\r\nX-Case: good\r\n" in request:
                    self.good_on_odd.append(odd_seen)
                    conn.sendall(GOOD)
                    continue
                odd_seen = True
                for piece, pause in plan.segments or [(plan.data, 0.0)]:
                    if pause:
                        time.sleep(pause)
                    conn.sendall(piece)
                if plan.end == "hang":
                    release.wait(10)
                    return
                if plan.end == "close":
                    return
        except OSError:
            pass  # the client gave up on this connection (as it should, e.g. after MAX_BODY)
        finally:
            conn.close()


@pytest.fixture(scope="module")
def server():
    s = ScriptServer()
    yield s
    s.release.set()
    s.close()


def run(server: ScriptServer, plan: Plan, *, timeout: float = TIMEOUT):
    """The odd request, then a plain one, on a fresh client. Returns (answer or exception, elapsed
    seconds, plain answer, for each plain request the server read whether it came on the odd
    request's connection, exceptions the event loop reported).

    Pooling is judged per connection, not by counting connections: on a loaded machine a short
    deadline can pass before the odd request even connects, and then one connection is right."""
    server.reset(plan)
    client = Client()
    loop_errors: list = []
    client.loop.call_soon_threadsafe(client.loop.set_exception_handler, lambda loop, ctx: loop_errors.append(ctx))

    def post(case: str, deadline: float):
        return asyncio.run_coroutine_threadsafe(
            client.post(scheme="http", host="127.0.0.1", port=server.port, path="/cb",
                        headers={"X-Case": case}, body=b'{"n": 1}', timeout=deadline), client.loop
        ).result(deadline + 10)

    try:
        start = time.monotonic()
        try:
            first = post("odd", timeout)
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            first = exc
        elapsed = time.monotonic() - start
        second = post("good", TIMEOUT)
        idle = [conn for conns in client._idle.values() for conn in conns]
        assert all(conn.reusable and not conn.closed for conn in idle)
    finally:
        client.stop()
    return first, elapsed, second, list(server.good_on_odd), loop_errors


def assert_plain_answer_after(second, good_on_odd: list, *, reused: bool) -> None:
    assert (second.status, second.body, second.headers.get("x-good")) == (200, b"good", "1")
    assert good_on_odd == [reused], "a connection was pooled that should not be, or the reverse"


def assert_failed_attempt(outcome, *kinds) -> None:
    """An error the dispatcher records as a failed attempt, with something to read in the record."""
    assert isinstance(outcome, kinds), f"expected one of {kinds}, got {outcome!r}"
    assert isinstance(outcome, TimeoutError) or str(outcome)


# --- strategies ---------------------------------------------------------------------------------

FRAMING_HEADERS = {"content-length", "transfer-encoding", "connection", "upgrade", "proxy-connection", "keep-alive"}
NAMES = st.text(string.ascii_letters + string.digits + "-_!#$%&'*+.^`|~", min_size=1, max_size=16).filter(
    lambda n: n.lower() not in FRAMING_HEADERS)
VALUES = st.text(string.ascii_letters + string.digits + " -_;,=/.:\"()[]{}?@", max_size=40).map(str.strip)
HEADERS = st.lists(st.tuples(NAMES, VALUES), max_size=6)
PATTERN = bytes(range(33, 127))  # visible ASCII: a header value of it survives stripping


def _filler(n: int) -> bytes:
    return (PATTERN * (n // len(PATTERN) + 1))[:n]


BODIES = st.one_of(
    st.binary(max_size=600),
    st.integers(0, 5000).map(_filler),
    st.sampled_from([MAX_BODY - 1, MAX_BODY, MAX_BODY + 1, 3 * MAX_BODY]).map(_filler),
)


@st.composite
def chunked_body(draw, body: bytes) -> bytes:
    """``body`` in chunks of drawn sizes, with odd size spellings, extensions and trailers."""
    out, i = [], 0
    while i < len(body):
        size = draw(st.integers(1, max(1, min(len(body) - i, draw(st.sampled_from([1, 7, 100, 5000, 70000]))))))
        out.append(_chunk_line(draw, size) + body[i:i + size] + b"\r\n")
        i += size
    out.append(_chunk_line(draw, 0))
    for name, value in draw(st.lists(st.tuples(NAMES, VALUES), max_size=3)):
        out.append(f"{name}: {value}\r\n".encode())
    out.append(b"\r\n")
    return b"".join(out)


def _chunk_line(draw, size: int) -> bytes:
    digits = draw(st.sampled_from(["{:x}", "{:X}", "0{:x}", "00{:X}"])).format(size)
    extension = draw(st.sampled_from(["", ";a", ";a=b", ';name="quoted value"', ";x=1;y=2"]))
    return f"{digits}{extension}\r\n".encode()


@st.composite
def answers(draw, *, small: bool = False) -> Plan:
    """A valid answer: 0-3 interim answers, then the final one in one of the framings."""
    data = []
    for _ in range(draw(st.integers(0, 3))):
        status = draw(st.sampled_from([100, 102, 103]))
        lines = [f"HTTP/1.1 {status} Interim"] + [f"{n}: {v}" for n, v in draw(HEADERS)]
        data.append(("\r\n".join(lines) + "\r\n\r\n").encode())
    version = draw(st.sampled_from(["1.1", "1.1", "1.0"]))
    status = draw(st.one_of(st.sampled_from([200, 201, 202, 204, 304, 301, 400, 410, 429, 500, 503]),
                            st.integers(200, 599)))
    body = draw(st.binary(max_size=300) if small else BODIES)
    close = draw(st.booleans())
    keep_alive_10 = version == "1.0" and not close and draw(st.booleans())
    if status in (204, 304):
        framing, body = "none", b""
    elif version == "1.0":
        framing = draw(st.sampled_from(["length", "close"]))
    else:
        framing = draw(st.sampled_from(["length", "chunked", "close"]))
    headers = draw(HEADERS)
    if framing == "length":
        headers.append(("Content-Length", str(len(body))))
    elif framing == "chunked":
        headers.append(("Transfer-Encoding", "chunked"))
    if close:
        headers.append(("Connection", "close"))
    elif keep_alive_10:
        headers.append(("Connection", "keep-alive"))
    reason = draw(st.sampled_from([" OK", " Whatever It Is", " ", ""]))  # the reason phrase may be empty
    head = "\r\n".join([f"HTTP/{version} {status}{reason}"] + [f"{n}: {v}" for n, v in headers]) + "\r\n\r\n"
    data.append(head.encode())
    head_end = sum(map(len, data))
    data.append(draw(chunked_body(body)) if framing == "chunked" else body)
    persistent = (version == "1.1" and not close) or keep_alive_10
    plan = Plan(data=b"".join(data), head_end=head_end, status=status, body=body, framing=framing,
                headers={n.lower(): v for n, v in headers},
                reusable=persistent and framing != "close" and len(body) <= MAX_BODY,
                end="keep" if persistent and framing != "close" else "close")
    if not persistent and framing != "close" and draw(st.booleans()):
        plan.end = "keep"  # a server that says close but keeps serving: the client must still not reuse
    return plan


@st.composite
def drips(draw, plan: Plan) -> list:
    """``plan.data`` cut at drawn places, each piece after a short pause."""
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(plan.data) - 1)), max_size=6)))
    bounds = [0, *[c for c in cuts if c < len(plan.data)], len(plan.data)]
    return [(plan.data[a:b], draw(st.sampled_from([0.0, 0.0, 0.001, 0.004]))) for a, b in zip(bounds, bounds[1:])]


FUZZ = settings(deadline=None, max_examples=120, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.data_too_large])


# --- valid answers, in one piece or dripped -------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_valid_answers_are_read_exactly_and_pooled_only_when_reusable(server, data):
    plan = data.draw(answers())
    if data.draw(st.booleans()):
        plan.segments = data.draw(drips(plan))
    answer, elapsed, second, good_on_odd, loop_errors = run(server, plan)
    assert not isinstance(answer, Exception), f"{answer!r} for {plan.data[:300]!r}"
    assert (answer.status, answer.headers) == (plan.status, plan.headers)
    assert answer.body == plan.body[:MAX_BODY]
    assert elapsed < TIMEOUT
    assert_plain_answer_after(second, good_on_odd, reused=plan.reusable)
    assert loop_errors == []


# --- answers cut short ----------------------------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_truncated_answers_closed_by_the_server(server, data):
    plan = data.draw(answers(small=True))
    cut = data.draw(st.integers(0, len(plan.data) - 1))
    plan.data, plan.segments, plan.end = plan.data[:cut], [], "close"
    outcome, elapsed, second, good_on_odd, loop_errors = run(server, plan)
    if plan.framing == "close" and cut >= plan.head_end:
        # close-delimited: the close is the end of the body, whatever came of it
        assert (outcome.status, outcome.body) == (plan.status, plan.body[:cut - plan.head_end])
    else:
        assert_failed_attempt(outcome, ConnectionResetError)
        assert ("before answering" if cut == 0 else "mid-answer") in str(outcome)
    assert elapsed < TIMEOUT
    assert_plain_answer_after(second, good_on_odd, reused=False)
    assert loop_errors == []


@settings(FUZZ, max_examples=12)
@given(data=st.data())
def test_truncated_answers_on_a_connection_left_open_time_out(server, data):
    plan = data.draw(answers(small=True))
    cut = data.draw(st.integers(0, len(plan.data) - 1))
    plan.data, plan.segments, plan.end = plan.data[:cut], [], "hang"
    outcome, elapsed, second, good_on_odd, loop_errors = run(server, plan, timeout=HANG_TIMEOUT)
    assert_failed_attempt(outcome, TimeoutError)
    assert HANG_TIMEOUT <= elapsed < HANG_TIMEOUT + SLACK
    assert_plain_answer_after(second, good_on_odd, reused=False)
    assert loop_errors == []


@pytest.mark.parametrize("sent", [b"", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
                                  b"HTTP/1.1 100 Continue\r\n\r\n"])
def test_early_close_before_and_after_the_status_line(server, sent):
    outcome, _, second, good_on_odd, loop_errors = run(server, Plan(data=sent, end="close"))
    assert_failed_attempt(outcome, ConnectionResetError)
    assert_plain_answer_after(second, good_on_odd, reused=False)
    assert loop_errors == []


# --- broken answers -------------------------------------------------------------------------------

# Not a prefix of an answer llhttp would go on reading ("HTTP/", and the "RTSP/" and "ICE/" it also
# parses): a lone "I" then a close is a truncated answer, not garbage.
GARBAGE = st.binary(min_size=1, max_size=300).filter(lambda b: b[:1] not in (b"H", b"R", b"I", b"\r", b"\n"))
BAD_FIELD = st.binary(min_size=1, max_size=200).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"") + b"\x00")


@FUZZ
@given(garbage=st.one_of(GARBAGE, BAD_FIELD.map(lambda b: b"HTTP/1.1 200 OK\r\nX" + b)),
       end=st.sampled_from(["close", "hang"]))
def test_garbage_is_a_protocol_error_at_once(server, garbage, end):
    outcome, elapsed, second, good_on_odd, loop_errors = run(server, Plan(data=garbage, end=end))
    assert_failed_attempt(outcome, ProtocolError)
    assert "invalid HTTP answer" in str(outcome)
    assert elapsed < TIMEOUT  # no waiting for more bytes, even when the server keeps the connection
    assert_plain_answer_after(second, good_on_odd, reused=False)
    assert loop_errors == []


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"HTTP/1.1 099 Low\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"RTSP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n Folded: header\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
], ids=["cl-not-a-number", "cl-twice", "cl-negative", "cl-and-chunked", "chunk-size-not-hex",
        "chunk-without-crlf", "chunk-size-overflow", "status-4-digits", "status-below-100", "http2", "rtsp",
        "leading-whitespace-header", "unasked-upgrade"])
def test_bad_framing_is_a_protocol_error(server, head):
    outcome, elapsed, second, good_on_odd, loop_errors = run(server, Plan(data=head, end="hang"))
    assert_failed_attempt(outcome, ProtocolError)
    assert elapsed < TIMEOUT
    assert_plain_answer_after(second, good_on_odd, reused=False)
    assert loop_errors == []


def test_bytes_after_a_complete_answer_drop_the_connection(server):
    data = b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    answer, _, second, good_on_odd, loop_errors = run(server, Plan(data=data, end="keep"))
    assert answer.status == 204
    assert_plain_answer_after(second, good_on_odd, reused=False)
    assert loop_errors == []


# --- huge heads and endless framing -----------------------------------------------------------------

@settings(FUZZ, max_examples=25)
@given(size=st.integers(MAX_HEAD + 1024, 4 * MAX_HEAD), count=st.sampled_from([1, 40, 2000]),
       pieces=st.integers(1, 8), interim=st.booleans(), end=st.sampled_from(["close", "hang"]))
def test_a_huge_header_section_is_refused_without_waiting(server, size, count, pieces, interim, end):
    each = size // count
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Big-%d: %s\r\n" % (i, _filler(each)) for i in range(count))
    data = (b"HTTP/1.1 100 Continue\r\n\r\n" if interim else b"") + head + b"Content-Length: 0\r\n\r\n"
    step = len(data) // pieces + 1
    plan = Plan(data=data, end=end, segments=[(data[i:i + step], 0.001) for i in range(0, len(data), step)])
    outcome, elapsed, second, good_on_odd, loop_errors = run(server, plan)
    assert_failed_attempt(outcome, ProtocolError)
    assert "too large" in str(outcome)
    assert elapsed < TIMEOUT
    assert_plain_answer_after(second, good_on_odd, reused=False)
    assert loop_errors == []


@settings(FUZZ, max_examples=10)
@given(size=st.integers(1, MAX_HEAD // 2), count=st.sampled_from([1, 10, 300]))
def test_a_large_header_section_under_the_limit_is_read(server, size, count):
    each = max(1, size // count)
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Big-%d: %s\r\n" % (i, _filler(each)) for i in range(count))
    answer, _, second, good_on_odd, loop_errors = run(server, Plan(data=head + b"Content-Length: 2\r\n\r\nok"))
    assert (answer.status, answer.body, answer.headers["x-big-0"]) == (200, b"ok", _filler(each).decode())
    assert_plain_answer_after(second, good_on_odd, reused=True)
    assert loop_errors == []


@pytest.mark.parametrize("data", [
    b"HTTP/1.1 200 OK\r\nX-Endless: " + b"v" * (3 * MAX_HEAD),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;" + b"e" * (12 * MAX_BODY),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Trailer: " + b"t" * (12 * MAX_BODY),
], ids=["header-value", "chunk-extension", "trailer"])
def test_endless_head_extension_or_trailer_stops_at_a_bound(server, data):
    """Bytes streamed without an end must not pile up until the deadline (memory) nor wait for it."""
    outcome, elapsed, second, good_on_odd, loop_errors = run(server, Plan(data=data, end="hang"), timeout=5.0)
    assert_failed_attempt(outcome, ProtocolError)
    assert elapsed < 5.0
    assert_plain_answer_after(second, good_on_odd, reused=False)
    assert loop_errors == []


# --- slow drip ------------------------------------------------------------------------------------

def test_a_slow_drip_that_ends_in_time_is_read(server):
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    plan = Plan(data=data, segments=[(data[i:i + 1], 0.005) for i in range(len(data))])
    answer, elapsed, second, good_on_odd, loop_errors = run(server, plan)
    assert (answer.status, answer.body) == (200, b"hello")
    assert_plain_answer_after(second, good_on_odd, reused=True)
    assert loop_errors == []


def test_a_drip_past_the_deadline_times_out_on_time(server):
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100
    plan = Plan(data=data, segments=[(data[i:i + 1], 0.02) for i in range(len(data))], end="close")
    outcome, elapsed, second, good_on_odd, loop_errors = run(server, plan, timeout=HANG_TIMEOUT)
    assert_failed_attempt(outcome, TimeoutError)
    assert HANG_TIMEOUT <= elapsed < HANG_TIMEOUT + SLACK
    assert_plain_answer_after(second, good_on_odd, reused=False)
    assert loop_errors == []
