"""A small HTTP/1.1 client on one asyncio event loop thread, for callbacks only; answers are
parsed by llhttp (Node.js's HTTP parser, through ``httptools``), not by hand.

Why not requests or http.client in a thread pool: measured on the 2-core machine against a
loopback receiver, a keep-alive POST costs ~900 us of CPU through ``requests.Session``, ~270 us
through urllib3, ~170 us through ``http.client`` (its header parsing goes through the email
package), and ~40 us here; and one loop thread serves hundreds of concurrent callbacks
without 64 threads fighting over the GIL. CPU is what bounds deliveries per second. An aiohttp
version of this client (same interface) was measured too: bench/push.py, 5 consumers, quiet
machine, same run conditions: aiohttp 1,294 deliveries/s (dispatcher 380 us CPU per delivery) vs
2,630/s here (168 us); the 1,500/s target is only met with this client. Why llhttp: it is
maintained and fuzzed as Node's parser, strict where a hand-written parser is lenient, and costs
no more CPU than the hand-written parser this module had (``bench/push.py --compare-clients``,
client alone, same run: 1.008x on a 204, 1.004x on a 200 with six headers and a JSON body).

What it does: POST with a body, keep-alive reuse per (scheme, host, port), new connections to one
(scheme, host, port) opened at a bounded rate when the client is built with ``connect_rate`` (a
token bucket: a request that finds no idle connection and no token waits, without CPU, for a
connection another request gives back or for the next token, inside its own deadline), TLS with certificate
verification and SNI, one total deadline per attempt (connect + send + full answer), no
redirects followed (a 3xx is an answer like any other), 1xx interim answers skipped, bodies by
Content-Length, chunked or until close, at most ``MAX_HEAD`` bytes of header section and
``MAX_BODY`` bytes of body kept (a longer body closes the connection). A connection goes back to
the pool only after a complete keep-alive answer with nothing after it. A request on a
kept-alive connection that the server had already closed is retried once on a new connection
(nothing was received, so nothing was processed). Deadlines are kept in 50 ms slots, one timer per
slot (``DEADLINE_GRAIN``): an attempt ends at most that much after its timeout.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import ssl
import threading
import time
from collections import defaultdict, deque
from urllib.parse import quote

import httptools
import uvloop

from broker import netpolicy

logger = logging.getLogger(__name__)
MAX_BODY = 64 * 1024
MAX_HEAD = 64 * 1024
MAX_ANSWER = MAX_HEAD + 8 * MAX_BODY  # raw bytes of one answer before its body is settled
IDLE_LIMIT = 30.0  # seconds an idle connection is kept for reuse
DEADLINE_GRAIN = 0.05  # seconds: a request's deadline is rounded up to this (requests share timers)


class ProtocolError(Exception):
    """The server's answer is not valid HTTP/1.x."""


class _Stop(Exception):
    """Raised from a parser callback to stop reading: the answer is settled (see ``Connection``)."""


class Answer:
    __slots__ = ("status", "headers", "body", "peer")

    def __init__(self, status: int, headers: dict, body: bytes, peer: str = ""):
        self.status = status
        self.headers = headers  # lower-case str names -> str values
        self.body = body
        self.peer = peer  # the IP address that answered ("" when unknown)


def _chunked(transfer_encoding: str) -> bool:
    """RFC 9112 6.3: a body is chunked when chunked is the last transfer coding."""
    return transfer_encoding.rpartition(",")[2].strip().lower() == "chunked"


class Connection(asyncio.Protocol):
    """One connection, one request at a time; llhttp parses the answer as bytes arrive and calls
    the ``on_*`` methods below. ``final`` is set once the head of a non-1xx answer is read,
    ``complete`` once its body is (or once enough of it is kept)."""

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.reusable = False
        self.received = False
        self.waiter: asyncio.Future | None = None
        self.complete = True
        self.peer = ""  # the address connected to (connection_made)

    # --- asyncio callbacks ---------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if peer else ""

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if self.final and self.until_close:
                self._finish(keep=False)  # a body without Content-Length or chunks ends at close
            else:
                self.waiter.set_exception(ConnectionResetError("server closed the connection before answering"
                                                               if not self.received else
                                                               "server closed the connection mid-answer"))

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.close()  # bytes nobody asked for: the connection is unusable
            return
        self.received = True
        self.taken += len(data)
        if len(self.lead) < 16:
            self.lead += data[:16]
        error = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            error = ProtocolError("invalid HTTP answer: 101 Switching Protocols to a POST")
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # what a callback below raised, if one did
            if cause is None:
                error = ProtocolError(f"invalid HTTP answer: {exc}")  # llhttp's reason
            elif isinstance(cause, ProtocolError):
                error = cause
            elif not isinstance(cause, _Stop):
                raise cause  # a bug here, not the server's: asyncio logs it and drops the connection
        if self.complete:
            self._finish(keep=self.keep and error is None)
        elif error is None and self.taken > (MAX_ANSWER if self.final else MAX_HEAD):
            error = ProtocolError("header section too large" if not self.final else
                                  "answer framing too large (chunk extensions or trailers)")
        if error is not None and not self.complete:
            self.waiter.set_exception(error)
            self.close()

    # --- llhttp callbacks (httptools): raising stops the parser -----------------------------------
    def on_message_begin(self) -> None:
        if self.complete:
            self.keep = False  # bytes after the answer: the server is out of step, drop the connection
            raise _Stop
        self.headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        if self.head_size > MAX_HEAD:
            raise ProtocolError("header section too large")
        if not self.final:  # trailers after a chunked body are not kept
            self.headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        # llhttp also reads RTSP/ and ICE/ answers and HTTP/2.0 heads: none is an HTTP/1.x answer
        http1 = self.parser.get_http_version()[:2] == "1." and self.lead.lstrip(b"\r\n").startswith(b"HTTP/")
        if status < 100 or not http1:
            raise ProtocolError(f"invalid HTTP answer: status {status}, {bytes(self.lead[:12])!r}...")
        if status < 200:
            return  # interim answer (100 Continue, 103 Early Hints): the real one follows
        self.status, self.final = status, True
        headers = self.headers
        self.until_close = "content-length" not in headers and not _chunked(headers.get("transfer-encoding", ""))

    def on_body(self, body: bytes) -> None:
        if not self.final:
            return
        kept = len(self.body)
        if kept + len(body) <= MAX_BODY:
            self.body += body
            return
        self.body += body[:MAX_BODY - kept]  # too long to read to the end: keep the start, give up the connection
        self.complete, self.keep = True, False
        raise _Stop

    def on_message_complete(self) -> None:
        if self.final:
            self.complete, self.keep = True, self.parser.should_keep_alive()

    # --- request -------------------------------------------------------------------------------
    def request(self, data: bytes) -> asyncio.Future:
        self.received = self.final = self.complete = self.keep = self.until_close = False
        self.status = self.taken = self.head_size = 0
        self.headers: dict = {}
        self.body = bytearray()
        self.lead = b""  # the answer's first bytes, for its protocol name
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _finish(self, *, keep: bool) -> None:
        self.reusable = keep and not self.closed
        self.waiter.set_result(Answer(self.status, self.headers, bytes(self.body), self.peer))
        if not self.reusable:
            self.close()


def _ascii_path(path: str) -> bytes:
    try:
        return path.encode("ascii")
    except UnicodeEncodeError:
        return quote(path, safe="/?&=%:@!$'()*+,;~-._").encode("ascii")


def _header_bytes(value: str) -> bytes:
    value = value.replace("\r", " ").replace("\n", " ")
    try:
        return value.encode("latin-1")  # WSGI decoded the producer's header bytes as latin-1
    except UnicodeEncodeError:
        return value.encode("utf-8")


def _header_section(headers: dict) -> bytes:
    """``name: value`` lines, each ending in CRLF. A value's CR and LF become spaces, a value outside
    latin-1 goes as UTF-8 (``_header_bytes``); the usual headers (latin-1, no line breaks: the
    broker's own and the stored metadata, checked when stored) are joined and encoded in one go,
    a fifth of the cost of one header at a time."""
    values = "".join(headers.values())
    if "\r" not in values and "\n" not in values:
        try:
            return "".join([f"{name}: {value}\r\n" for name, value in headers.items()]).encode("latin-1")
        except UnicodeEncodeError:
            pass
    return b"".join([name.encode("latin-1") + b": " + _header_bytes(value) + b"\r\n" for name, value in headers.items()])


def _request_start(scheme: str, host: str, port: int, path: str) -> bytes:
    """The request line and Host header of a POST to this URL (kept per URL by the client)."""
    host_header = f"[{host}]" if ":" in host else host
    if (scheme, port) not in (("http", 80), ("https", 443)):
        host_header = f"{host_header}:{port}"
    return b"POST " + _ascii_path(path) + b" HTTP/1.1\r\nHost: " + host_header.encode("idna") + b"\r\n"


class _Pacing:
    """New connections to one endpoint: a token bucket (``rate`` a second, at most ``burst`` at once)
    and the requests waiting for a token or for a connection given back, oldest first."""

    __slots__ = ("tokens", "stamp", "waiters", "timer")

    def __init__(self, burst: float, now: float) -> None:
        self.tokens = burst
        self.stamp = now
        self.waiters: deque[asyncio.Future] = deque()
        self.timer: asyncio.TimerHandle | None = None

    def take(self, *, rate: float, burst: float, now: float) -> bool:
        self.tokens = min(burst, self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def waiter(self) -> asyncio.Future | None:
        """The oldest request still waiting (those whose deadline passed meanwhile are dropped)."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                return fut
        return None


class Client:
    """The event loop thread and its keep-alive connections. ``post`` is called from other
    threads; ``on_done(job, target, answer_or_error, started, finished)`` runs on the loop thread.

    ``connect_rate``: new connections per second to one (scheme, host, port), ``connect_burst`` at
    once (None: unpaced). An endpoint that hangs then holds connections it got at that pace, never
    hundreds opened in one go; a healthy one reuses its connections and rarely waits."""

    def __init__(self, *, connect_rate: float | None = None, connect_burst: float | None = None,
                 loop_factory=uvloop.new_event_loop) -> None:
        # uvloop: the client alone costs 10.7 us of CPU per keep-alive POST on it, 27.0 on asyncio's
        # own loop (bench/push.py --compare-loops, 2026-11-30)
        self.loop = loop_factory()
        self._idle: dict[tuple, list[Connection]] = defaultdict(list)
        self.connect_rate = connect_rate if connect_rate and connect_rate > 0 else None
        self.connect_burst = max(1.0, float(connect_burst or connect_rate or 1.0))
        self._pacing: dict[tuple, _Pacing] = {}
        self._starts: dict[tuple, bytes] = {}  # (scheme, host, port, path): request line and Host header
        self._due: dict[int, set] = {}  # deadline slot (DEADLINE_GRAIN): the requests that end then
        self._expired: set = set()  # requests cancelled by their deadline, until they raise TimeoutError
        self.connects: dict[tuple, int] = defaultdict(int)  # connections opened per endpoint (tests, benchmarks)
        self._ssl: ssl.SSLContext | None = None
        self._thread = threading.Thread(target=self._run, name="push-http", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, items: list, handler) -> None:
        """Start ``handler(item)`` coroutines on the loop for every item (thread-safe)."""
        self.loop.call_soon_threadsafe(self._start, items, handler)

    def _start(self, items: list, handler) -> None:
        for item in items:
            self.loop.create_task(handler(item))

    def stop(self) -> None:
        def _close():
            for conns in self._idle.values():
                for conn in conns:
                    conn.close()
            self._idle.clear()
            self.loop.stop()

        if self.loop.is_running():
            self.loop.call_soon_threadsafe(_close)
            self._thread.join(timeout=5)

    # --- connections ---------------------------------------------------------------------------
    async def _connect(self, scheme: str, host: str, port: int) -> Connection:
        kwargs = {}
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            kwargs = {"ssl": self._ssl, "server_hostname": host}
        if not netpolicy.enabled():
            _, conn = await self.loop.create_connection(lambda: Connection((scheme, host, port)), host, port, **kwargs)
            return conn
        # Callback policy (broker.netpolicy): resolve, check every address, then connect to a checked
        # address itself, so a DNS answer that changed since registration (rebinding) cannot slip
        # through; a refused address raises CallbackDenied (an OSError: a failed attempt).
        infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = netpolicy.addresses_check(host, list(dict.fromkeys(info[4][0] for info in infos)))
        error: OSError = OSError(f"no address for {host}")
        for address in addresses:
            try:
                _, conn = await self.loop.create_connection(lambda: Connection((scheme, host, port)),
                                                            address, port, **kwargs)
                return conn
            except OSError as exc:
                error = exc
        raise error

    def _reuse(self, key: tuple) -> Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_LIMIT:
                return conn
            conn.close()
        return None

    def _release(self, conn: Connection) -> None:
        pacing = self._pacing.get(conn.key)
        if conn.reusable and not conn.closed:
            waiter = pacing.waiter() if pacing is not None else None
            if waiter is not None:
                waiter.set_result(conn)  # straight to a request waiting for a connection
                return
            conn.idle_since = time.monotonic()
            self._idle[conn.key].append(conn)
        else:
            conn.close()
            if pacing is not None and pacing.waiters:
                self._pacing_wake(conn.key)  # a connection fewer: a waiter may connect when a token is due

    async def _open(self, scheme: str, host: str, port: int, key: tuple) -> tuple[Connection, bool]:
        """A connection for one request: a new one when the endpoint's pacing allows it now, else the
        first one given back or the next token (whichever comes first). Returns (connection, reused)."""
        rate = self.connect_rate
        if rate is None:
            return await self._connect_counted(scheme, host, port, key), False
        now = time.monotonic()
        pacing = self._pacing.get(key)
        if pacing is None:
            pacing = self._pacing[key] = _Pacing(self.connect_burst, now)
        if not pacing.waiters and pacing.take(rate=rate, burst=self.connect_burst, now=now):
            return await self._connect_counted(scheme, host, port, key), False
        fut = self.loop.create_future()
        pacing.waiters.append(fut)
        self._pacing_wake(key)
        try:
            conn = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result() is not None:
                self._release(fut.result())  # given to us as the deadline passed: to the next one
            raise
        if conn is not None:
            return conn, True
        return await self._connect_counted(scheme, host, port, key), False

    def _pacing_wake(self, key: tuple) -> None:
        """Give the endpoint's next token to its oldest waiter, now or when the token is due."""
        pacing = self._pacing.get(key)
        if pacing is None or pacing.timer is not None:
            return
        now = time.monotonic()
        while pacing.waiters:
            if not pacing.take(rate=self.connect_rate, burst=self.connect_burst, now=now):
                due = (1.0 - pacing.tokens) / self.connect_rate

                def fire(key=key, pacing=pacing) -> None:
                    pacing.timer = None
                    self._pacing_wake(key)

                pacing.timer = self.loop.call_later(max(0.001, due), fire)
                return
            waiter = pacing.waiter()
            if waiter is None:
                pacing.tokens += 1.0  # nobody left to use it
                return
            waiter.set_result(None)  # None: connect

    async def _connect_counted(self, scheme: str, host: str, port: int, key: tuple) -> Connection:
        self.connects[key] += 1
        return await self._connect(scheme, host, port)

    async def post(self, *, scheme: str, host: str, port: int, path: str, headers: dict, body: bytes,
                   timeout: float) -> Answer:
        """One POST with a total deadline of ``timeout`` seconds. Raises TimeoutError, OSError,
        ssl.SSLError or ProtocolError."""
        start = self._starts.get((scheme, host, port, path))
        if start is None:
            if len(self._starts) > 10000:
                self._starts.clear()  # URLs come and go with consumers: never an unbounded cache
            start = self._starts[(scheme, host, port, path)] = _request_start(scheme, host, port, path)
        data = b"%sContent-Length: %d\r\n%s\r\n%s" % (start, len(body), _header_section(headers), body)
        key = (scheme, host, port)
        conn = None
        task = asyncio.current_task()
        due = self._deadline_add(task, time.monotonic() + timeout)
        try:
            for attempt in (1, 2):
                conn = self._reuse(key)
                reused = conn is not None
                if conn is None:
                    conn, reused = await self._open(scheme, host, port, key)
                try:
                    answer = await conn.request(data)
                except ConnectionResetError:
                    if reused and not conn.received and attempt == 1:
                        conn.close()
                        continue  # the server had closed this idle connection: once more, fresh
                    raise
                self._release(conn)
                conn = None
                return answer
        except asyncio.CancelledError:
            if task in self._expired:
                self._expired.discard(task)
                if task.uncancel() == 0:  # cancelled by its deadline alone (as asyncio.timeout tells them apart)
                    raise TimeoutError from None
            raise
        finally:
            waiting = self._due.get(due)
            if waiting is not None:
                waiting.discard(task)
            if conn is not None:
                conn.close()  # timed out or failed mid-exchange: the connection's state is unknown
        raise ConnectionResetError("unreachable")  # pragma: no cover

    # --- deadlines -----------------------------------------------------------------------------
    def _deadline_add(self, task: asyncio.Task, when: float) -> int:
        """Cancel ``task`` at ``when`` (rounded up to ``DEADLINE_GRAIN``): the requests due in one grain
        share one timer, so a request costs a set insertion instead of a timer of its own in the
        loop's heap (asyncio.timeout: a fifth of this thread's CPU per callback)."""
        slot = math.ceil(when / DEADLINE_GRAIN)
        tasks = self._due.get(slot)
        if tasks is None:
            tasks = self._due[slot] = set()
            self.loop.call_at(slot * DEADLINE_GRAIN, self._deadline_fire, slot)
        tasks.add(task)
        return slot

    def _deadline_fire(self, slot: int) -> None:
        for task in self._due.pop(slot, ()):
            if not task.done():
                self._expired.add(task)
                task.cancel()
