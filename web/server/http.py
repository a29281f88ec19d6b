"""HTTP/1.1 on an asyncio event loop: llhttp's parser (httptools) feeds ``Connection``, one per
client; ``Server`` holds the connections, the thread pool of WSGI calls and the clock.

What a connection does, and why:

- **Keep-alive and pipelining.** Requests are parsed as bytes arrive; each waits its turn and
  their answers go out in the order they came (RFC 9112 9.3.2). A connection is closed after a
  request that asks for it, an HTTP/1.0 request without keep-alive, a parse error (answered 400
  first, in its turn), or a request whose unread body is larger than ``Limits.drain``.
- **Request bodies stream** to the WSGI application as it reads them (``wsgi.RequestBody``):
  reading from the socket pauses when ``Limits.buffer`` bytes wait unread, so a large body is
  read only if the application asks for it (the broker checks credentials first), and
  ``Expect: 100-continue`` is answered when it first reads. A chunked body (no Content-Length) is
  read whole first, up to ``Limits.chunked``: Django reads a body only up to CONTENT_LENGTH.
- **Timeouts**, checked by one sweep of the clock (not a timer per request): a connection idle
  between requests closes after ``Limits.keepalive``; a request's head must arrive within
  ``Limits.header`` of its first byte; a body that stops arriving for ``Limits.body`` fails its
  reader; an answer the client does not take for ``Limits.write`` closes the connection.
- **Limits** as gunicorn's settings name them: the request line (414), header fields and their size
  (431). Header names holding ``_`` are dropped (gunicorn's ``header_map`` "drop"; "refuse": 400),
  a repeated Host or Content-Type is a 400, an ``Expect`` other than 100-continue a 417, and the
  scheme comes from gunicorn's ``secure_scheme_headers`` when the peer is in
  ``forwarded_allow_ips``.
- **Native routes**: ``Server.native`` (``web.server.native``) may take a request at the end of its
  head (``match``): its body is then buffered (it must be small and declared) and the request is
  handed over whole on the event loop (``handle``); the handler answers at once or later with
  ``Request.respond`` (on the loop), or declines and the request goes the full way. Everything
  else runs the WSGI application in a pool thread (``web.server.wsgi``).

A client that went away is visible to a long poll through ``Request.client_gone`` (the environ's
``broker.client_gone``): the peer closed or half-closed its side.
"""

from __future__ import annotations

import asyncio
import logging
import select
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import formatdate
from urllib.parse import unquote_to_bytes

import httptools

logger = logging.getLogger("gunicorn.error")

TICK = 0.25  # seconds between two sweeps of the clock (timeouts, the Date header, the loop's lag)
# ... while no request is being answered and no connection times out sooner: an idle worker wakes
# once a second, not four times (its share of an idle broker's CPU; issue 34)
TICK_IDLE = 1.0
WRITE_BUFFER = 256 * 1024  # answer bytes the transport holds before a streaming thread waits
HEADER_KEYS_MAX = 2048  # distinct header names remembered with their environ keys
HUNG_UP = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR
STATUS_BAD = {400: b"400 Bad Request", 408: b"408 Request Timeout", 413: b"413 Content Too Large",
              414: b"414 URI Too Long", 417: b"417 Expectation Failed",
              431: b"431 Request Header Fields Too Large", 500: b"500 Internal Server Error",
              501: b"501 Not Implemented", 503: b"503 Service Unavailable"}


def _future_done(future: asyncio.Future) -> None:
    """The end of the clock's idle pause (a timer's callback; a request may have ended it first)."""
    if not future.done():
        future.set_result(None)


@dataclass(frozen=True)
class Limits:
    """A connection's limits and timeouts (seconds, bytes); the worker fills them from gunicorn's
    configuration."""

    keepalive: float = 75.0  # an idle keep-alive connection is closed after this
    header: float = 30.0  # from a request's first byte to the end of its head
    body: float = 30.0  # a request body that stops arriving (its reader fails)
    write: float = 60.0  # an answer the client does not read: the connection is closed
    request_line: int = 4094
    header_fields: int = 100
    header_field_size: int = 8190
    buffer: int = 256 * 1024  # body bytes read ahead of the application before reading pauses
    drain: int = 64 * 1024  # an unread body up to this is skipped to keep the connection; more: closed
    chunked: int = 64 * 1024 * 1024  # a chunked body is read whole first, up to this (413 past it)
    native_body: int = 64 * 1024  # the largest declared body a native route takes (larger: the full way)


class HttpError(Exception):
    """A request the server refuses itself (``status`` in ``STATUS_BAD``)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class Request:
    """One request of a connection: its head as the WSGI environ, its body as it arrives."""

    __slots__ = ("conn", "environ", "method", "version", "keep_alive", "expect_continue", "continue_sent",
                 "length", "chunked", "body", "received", "complete", "consumed", "native", "started",
                 "head_done", "error", "answered", "status", "sent", "url", "headers", "read_error", "upgrade",
                 "dispatched")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.environ: dict | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.method = ""
        self.version = "1.1"
        self.keep_alive = True
        self.expect_continue = False
        self.continue_sent = False
        self.length: int | None = None  # declared Content-Length
        self.chunked = False
        self.body = bytearray()  # received and not yet read by the application
        self.received = 0  # body bytes received so far
        self.complete = False  # the whole message is in
        self.consumed = False  # the application read it to its end
        self.native = None  # the native route's match, when a native route takes it
        self.started = time.monotonic()
        self.head_done = False
        self.error: HttpError | None = None  # a refusal of the server, answered in its turn
        self.answered = False
        self.status = 0
        self.sent = 0
        self.read_error: str | None = None  # why reading the body failed (the connection is gone, a timeout)
        self.upgrade = False
        self.dispatched = False  # handed to its handler (native or WSGI), which answers it

    # --- for native handlers (on the event loop) ---------------------------------------------

    def respond(self, head: bytes, body: bytes = b"") -> None:
        """Answer with ``head`` (the status line and header lines, each ending CRLF, Content-Length
        included; no blank line) and ``body``, on the event loop. The server adds Date and, when it
        closes the connection after this answer, ``Connection: close``."""
        self.conn.answer(self, head, body)

    def respond_threadsafe(self, head: bytes, body: bytes = b"") -> None:
        self.conn.loop.call_soon_threadsafe(self.conn.answer, self, head, body)

    # --- for long polls (any thread) ---------------------------------------------------------

    def client_gone(self) -> bool:
        """Whether the client has closed (or half-closed) its side of the connection."""
        return self.conn.gone()


class Connection(asyncio.Protocol):
    """One client connection: parses requests, answers them in order (see the module docstring)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.sock = None
        self.base_environ: dict = {}
        self.trusted = False  # the peer may set the scheme headers (forwarded_allow_ips)
        self.parsing: Request | None = None  # the request whose message is arriving
        self.active: Request | None = None  # the request being answered
        self.waiting: deque[Request] = deque()  # parsed, waiting for their turn
        self.buffered = 0  # body bytes held for requests and not read yet
        self.reading_paused = False
        self.closed = False  # the transport is closed (connection_lost)
        self.peer_eof = False  # the client closed its side
        self.close_after = False  # close once the answers owed are written
        self.deadline: float | None = None  # when the connection times out (the sweep closes it)
        self.lock = threading.Lock()  # guards the body buffers and the write accounting across threads
        self.readable = threading.Condition(self.lock)  # a WSGI thread waits here for body bytes
        self.writable = threading.Event()  # set while the transport takes more writes
        self.writable.set()
        self.queued = 0  # streamed answer bytes a WSGI thread handed over and the loop has not written
        self.broken = False  # the parser failed: nothing more is read

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER)
        self.sock = transport.get_extra_info("socket")
        peer = transport.get_extra_info("peername")
        self.base_environ = self.server.environ_for(transport.get_extra_info("sockname"), peer)
        self.trusted = self.server.trusted(peer)
        self.deadline = time.monotonic() + self.server.limits.keepalive
        self.server.connections.add(self)
        if self.server.closing:
            self.close_after = True
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # An Upgrade (WebSocket, h2c) is not offered: the request is answered as a plain one and
            # the connection closed after it (what follows its head is not HTTP/1.1 any more).
            self._pause_reading()
            self.close_after = True
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if not isinstance(cause, HttpError):
                logger.error("error parsing a request", exc_info=cause)
                cause = HttpError(500 if isinstance(cause, Exception) and not isinstance(cause, ValueError) else 400,
                                  "bad request")
            self._refuse(cause)
        except httptools.HttpParserError as exc:
            self._refuse(HttpError(400, f"invalid HTTP: {exc}"))

    def eof_received(self) -> bool:
        self.peer_eof = True
        if self.active is None and not self.waiting:
            return False  # nothing owed: close
        self.close_after = True
        return True  # answer what was asked first (a half-closed client still reads)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.connections.discard(self)
        with self.lock:
            self.readable.notify_all()
        self.writable.set()  # a writer waiting for room gives up (its writes are dropped)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()
        with self.lock:
            self.readable.notify_all()  # a WSGI thread waiting for room to write

    # --- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.parsing = Request(self)
        if self.active is None:
            self.deadline = self.parsing.started + self.server.limits.header

    def on_url(self, url: bytes) -> None:
        req = self.parsing
        req.url += url
        if len(req.url) > self.server.limits.request_line:
            raise HttpError(414, "request line too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.parsing
        req.headers.append((name, value))
        limits = self.server.limits
        if len(req.headers) > limits.header_fields:
            raise HttpError(431, "too many header fields")
        if len(name) + len(value) > limits.header_field_size:
            raise HttpError(431, "header field too large")

    def on_headers_complete(self) -> None:
        req = self.parsing
        parser = self.parser
        req.method = parser.get_method().decode("ascii")
        req.version = parser.get_http_version()
        req.keep_alive = parser.should_keep_alive()
        req.upgrade = parser.should_upgrade()
        req.environ = self.server.environ_build(self, req)  # raises HttpError on a refused head
        req.head_done = True
        if req.chunked and req.expect_continue and req.method != "HEAD":
            self._continue(req)  # a chunked body is read whole before the application runs
        native = self.server.native
        if (native is not None and not req.chunked and not req.expect_continue
                and (req.length or 0) <= self.server.limits.native_body):
            req.native = native.match(req)
        if self.active is None and not self.waiting:
            self._start(req)
        else:
            self.waiting.append(req)

    def on_body(self, data: bytes) -> None:
        req = self.parsing
        n = len(data)
        req.received += n
        if req.chunked and req.received > self.server.limits.chunked:
            raise HttpError(413, "chunked request body too large")
        with self.lock:
            if req.consumed:  # skipped: the application has answered without reading it all
                return
            req.body += data
            self.buffered += n
            if req is self.active:
                self.readable.notify_all()
        if self.buffered > self.server.limits.buffer and not req.chunked:
            self._pause_reading()

    def on_message_complete(self) -> None:
        req = self.parsing
        self.parsing = None
        with self.lock:
            req.complete = True
            if req is self.active:
                self.readable.notify_all()
        if req is self.active:
            if req.native is not None or req.chunked:
                self._dispatch(req)
            elif req.consumed:  # answered before its body was all in: the next request may start
                self._next()

    # --- requests --------------------------------------------------------------------------------

    def _start(self, req: Request) -> None:
        """``req`` becomes the request being answered."""
        self.active = req
        self.deadline = None
        self.server.clock_wake()
        if req.error is not None:
            self._answer_error(req)
        elif req.complete or (req.native is None and not req.chunked):
            self._dispatch(req)
        else:  # a native request or a chunked body: the whole body first
            self.deadline = time.monotonic() + self.server.limits.body
            self._resume_reading()

    def _dispatch(self, req: Request) -> None:
        self.deadline = None
        req.dispatched = True
        if req.chunked:
            req.environ["CONTENT_LENGTH"] = str(req.received)
        if req.native is not None:
            try:
                if self.server.native.handle(req.native, req):
                    return
            except Exception:  # noqa: BLE001 - a native handler's bug: the full way answers
                logger.exception("native handler failed for %s %s; going the full way", req.method,
                                 req.environ.get("RAW_URI"))
            req.native = None
        self.server.wsgi_submit(self, req)

    def _refuse(self, error: HttpError) -> None:
        """A request the server refuses: answered in its turn, then the connection closes."""
        self.broken = True
        self._pause_reading()
        req = self.parsing or Request(self)
        self.parsing = None
        req.error = error
        req.keep_alive = False
        req.complete = True
        if req.environ is None:
            req.environ = {"REQUEST_METHOD": req.method or "-", "RAW_URI": req.url.decode("latin-1"),
                           "SERVER_PROTOCOL": f"HTTP/{req.version}", **self.base_environ}
        if req is self.active and not req.dispatched:
            self._answer_error(req)
            return
        if req in self.waiting or req is self.active:
            if req is self.active:
                with self.lock:  # a WSGI reader of this body gets an error
                    req.read_error = str(error)
                    self.readable.notify_all()
            return
        if self.active is None and not self.waiting:
            self._start(req)
        else:
            self.waiting.append(req)

    def _answer_error(self, req: Request) -> None:
        error = req.error
        body = (str(error) + "\n").encode("latin-1", "replace")
        head = b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n" % (
            STATUS_BAD.get(error.status, b"400 Bad Request"), len(body))
        self.close_after = True
        self.answer(req, head, body)

    def answer(self, req: Request, head: bytes, body: bytes) -> None:
        """Write ``req``'s whole answer (event loop); then the next request's turn."""
        if req.answered:
            return
        self.send_head(req, head, body, last=True)
        self.finish(req)

    def send_head(self, req: Request, head: bytes, body: bytes, *, last: bool) -> None:
        """Write the head (with Date, and ``Connection: close`` when this is the last answer) and the
        first part of the body (event loop)."""
        req.status = int(head[9:12])
        close = self.close_after or not req.keep_alive or self.server.closing or (last and not self._keeps(req))
        if close:
            self.close_after = True
        extra = self.server.date_line + (b"Connection: close\r\n\r\n" if close else
                                         (b"Connection: keep-alive\r\n\r\n" if req.version == "1.0" else b"\r\n"))
        if req.method == "HEAD":
            body = b""
        if not self.closed:
            self.transport.write(head + extra + body if body else head + extra)
        req.sent += len(body)

    def send_more(self, req: Request, data: bytes) -> None:
        """More of a streamed answer's body (event loop)."""
        if req.method != "HEAD" and not self.closed:
            self.transport.write(data)
        with self.lock:
            self.queued -= len(data)
            self.readable.notify_all()  # a writer waiting for the queue to shrink
        req.sent += len(data)

    def _keeps(self, req: Request) -> bool:
        """Whether the connection may go on after ``req``'s answer: its body must be read or small."""
        if req.complete:
            return True
        if req.chunked or req.expect_continue and not req.continue_sent:
            return False
        return req.length is not None and req.length - req.received <= self.server.limits.drain

    def finish(self, req: Request) -> None:
        """``req`` is answered: skip what is left of its body, then the next request (event loop)."""
        req.answered = True
        self.server.requests_done += 1
        if self.closed:
            return
        if self.server.access_log is not None:
            self.server.access_log(req)
        with self.lock:
            req.consumed = True
            self.buffered -= len(req.body)
            req.body = bytearray()
        if self.close_after or not self._keeps(req):
            self.close_after = True
            self._close()
            return
        if not req.complete:  # its body's rest arrives and is skipped; then the next request
            self._resume_reading()
            self.deadline = time.monotonic() + self.server.limits.body
            return
        self._next()

    def _next(self) -> None:
        self.active = None
        if self.waiting:
            self._start(self.waiting.popleft())
        else:
            self.deadline = time.monotonic() + (self.server.limits.header if self.parsing is not None
                                                else self.server.limits.keepalive)
        self._resume_reading()

    def _continue(self, req: Request) -> None:
        """``100 Continue``: the client may send the body now."""
        if not req.continue_sent and not self.closed:
            req.continue_sent = True
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def continue_threadsafe(self, req: Request) -> None:
        if not req.continue_sent:
            self.loop.call_soon_threadsafe(self._continue, req)

    def _pause_reading(self) -> None:
        if not self.reading_paused and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.reading_paused and not self.closed and not self.broken:
            self.reading_paused = False
            self.transport.resume_reading()

    def resume_if_drained(self) -> None:
        """(event loop) A reader took body bytes: read on when little is held."""
        if self.buffered <= self.server.limits.buffer // 2:
            self._resume_reading()

    def _close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.abort()

    # --- shutdown and timeouts -------------------------------------------------------------------

    def shutdown(self) -> None:
        """Graceful stop: close now if idle, else after the request being answered."""
        self.close_after = True
        if self.active is None and not self.waiting:
            self._close()
        else:  # (reading goes on: the request being answered may still need its body)
            self.waiting.clear()

    def expired(self, now: float) -> None:
        """The deadline passed: an idle keep-alive connection (closed), a request head too slow (408,
        closed), or a body too slow (the connection is dropped)."""
        self.deadline = None
        if self.active is None and self.parsing is None:
            self._close()
        elif self.active is None and not self.parsing.head_done:
            self.broken = True
            self._pause_reading()
            req, self.parsing = self.parsing, None
            req.error = HttpError(408, "request head timed out")
            req.keep_alive = False
            if req.environ is None:
                req.environ = {"REQUEST_METHOD": req.method or "-", "RAW_URI": req.url.decode("latin-1"),
                               "SERVER_PROTOCOL": f"HTTP/{req.version}", **self.base_environ}
            self._start(req)
        else:
            self.abort()

    def gone(self) -> bool:
        """Whether the client closed its side (any thread): seen by the loop, or, while reading is
        paused, by polling the socket."""
        if self.closed or self.peer_eof:
            return True
        return self.reading_paused and peer_hung_up(self.sock)


def peer_hung_up(sock) -> bool:
    """Whether the peer of ``sock`` has closed its side (it polls as hung up; Linux POLLRDHUP)."""
    if not HUNG_UP:
        return False
    try:
        fd = sock.fileno()
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, HUNG_UP)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


class Server:
    """A worker's HTTP server: the listening sockets, the connections, the WSGI thread pool, the
    clock (``tick``: timeouts, Date, the event loop's lag)."""

    def __init__(self, *, app, loop: asyncio.AbstractEventLoop, threads: int, limits: Limits = Limits(),
                 native=None, scheme_headers: dict | None = None, forwarded=None, header_map: str = "drop",
                 multiprocess: bool = False, access_log=None, ssl_context=None, script_name: str = "",
                 runner=None) -> None:
        self.app = app
        self.loop = loop
        self.limits = limits
        self.native = native
        self.executor = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="broker-web")
        self.threads = max(1, threads)
        self.connections: set[Connection] = set()
        self.servers: list[asyncio.AbstractServer] = []
        self.closing = False
        self.requests_done = 0
        self.wsgi_busy = 0  # WSGI calls submitted and not finished
        self.runner = runner
        self.scheme_headers = {k.upper().encode("latin-1"): v for k, v in (scheme_headers or {}).items()}
        self.forwarded = forwarded or (lambda peer: False)
        self.header_map = header_map
        self.multiprocess = multiprocess
        self.access_log = access_log
        self.ssl_context = ssl_context
        self.script_name = script_name.rstrip("/")
        self.header_keys: dict[bytes, tuple[int, str]] = {}
        self.date_line = b""
        self._second = -1
        self.lag = 0.0  # how late the last tick ran (seconds): the event loop's backlog
        self.lag_max = 0.0  # the largest lag over the last second
        self._lag_window: deque[tuple[float, float]] = deque()
        self._ticking: asyncio.Task | None = None
        self._idle_pause: asyncio.Future | None = None  # the clock's idle pause, ended by a request
        self.tick_hooks: list = []  # called on every tick with the time (the worker's heartbeat)
        self._date()

    # --- listening -------------------------------------------------------------------------------

    async def start(self, sockets) -> None:
        """Serve on ``sockets`` (listening sockets, such as gunicorn's)."""
        for sock in sockets:
            server = await self.loop.create_server(lambda: Connection(self), sock=sock, ssl=self.ssl_context,
                                                   backlog=2048)
            self.servers.append(server)
        self._ticking = self.loop.create_task(self._tick())

    async def shutdown(self, grace: float) -> None:
        """Stop accepting, let the requests being answered finish within ``grace`` seconds, then
        close whatever is left."""
        self.closing = True
        for server in self.servers:
            server.close()
        for conn in list(self.connections):
            conn.shutdown()
        deadline = time.monotonic() + grace
        told = time.monotonic() + 1.0
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if time.monotonic() > told:
                told = float("inf")
                logger.info("stopping: waiting for %d connection(s): %s", len(self.connections), "; ".join(
                    f"{c.active.method} {c.active.environ.get('RAW_URI') if c.active.environ else '?'} "
                    f"(dispatched {c.active.dispatched}, answered {c.active.answered})" if c.active is not None
                    else f"idle (closed {c.closed}, parsing {c.parsing is not None})" for c in list(self.connections)[:5]))
        for conn in list(self.connections):
            conn.abort()
        if self._ticking is not None:
            self._ticking.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

    # --- the clock ---------------------------------------------------------------------------------

    def _date(self) -> None:
        now = time.time()
        if int(now) != self._second:
            self._second = int(now)
            self.date_line = b"Date: " + formatdate(now, usegmt=True).encode("ascii") + b"\r\n"

    async def _tick(self) -> None:
        loop_time = self.loop.time
        pause = TICK
        while True:
            due = loop_time() + pause
            if pause > TICK:  # an idle pause: the first request ends it (clock_wake)
                self._idle_pause = pause_over = self.loop.create_future()
                timer = self.loop.call_later(pause, _future_done, pause_over)
                await pause_over
                timer.cancel()
                self._idle_pause = None
            else:
                await asyncio.sleep(pause)
            now = time.monotonic()
            self.lag = max(0.0, loop_time() - due)
            window = self._lag_window
            window.append((now, self.lag))
            while window and window[0][0] < now - 1.0:
                window.popleft()
            self.lag_max = max(lag for _, lag in window)
            self._date()
            pause = TICK_IDLE
            for conn in list(self.connections):
                if conn.deadline is not None:
                    if now > conn.deadline:
                        conn.expired(now)
                    else:
                        pause = min(pause, max(TICK, conn.deadline - now))
                if conn.active is not None or conn.waiting:
                    pause = TICK
            for hook in self.tick_hooks:
                hook(now)

    def clock_wake(self) -> None:
        """A request starts: end the clock's idle pause, so it ticks at TICK again at once (the
        loop's lag, which admission reads, and the timeouts), and the Date line is this second's."""
        if self._idle_pause is not None and not self._idle_pause.done():
            self._date()
            self._idle_pause.set_result(None)

    # --- requests ------------------------------------------------------------------------------------

    def environ_for(self, sockname, peer) -> dict:
        """The environ keys a connection's requests share."""
        env = {"wsgi.version": (1, 0), "wsgi.url_scheme": "https" if self.ssl_context else "http",
               "wsgi.errors": _ERRORS, "wsgi.multithread": True, "wsgi.multiprocess": self.multiprocess,
               "wsgi.run_once": False, "wsgi.input_terminated": True, "SERVER_SOFTWARE": "broker",
               "SCRIPT_NAME": self.script_name}
        if isinstance(sockname, tuple):
            env["SERVER_NAME"], env["SERVER_PORT"] = str(sockname[0]), str(sockname[1])
        else:
            env["SERVER_NAME"], env["SERVER_PORT"] = "localhost", ""
        if isinstance(peer, tuple):
            env["REMOTE_ADDR"], env["REMOTE_PORT"] = str(peer[0]), str(peer[1])
        else:
            env["REMOTE_ADDR"] = peer.decode() if isinstance(peer, bytes) else str(peer or "")
        return env

    def trusted(self, peer) -> bool:
        return not isinstance(peer, tuple) or bool(self.forwarded(peer[0]))

    def _header_key(self, name: bytes) -> tuple[int, str]:
        """How a header name maps into the environ: (kind, key), remembered per name."""
        upper = name.upper()
        text = upper.decode("latin-1")
        if upper == b"CONTENT-LENGTH":
            found = (1, "CONTENT_LENGTH")
        elif upper == b"CONTENT-TYPE":
            found = (2, "CONTENT_TYPE")
        elif upper == b"EXPECT":
            found = (3, "HTTP_EXPECT")
        elif upper == b"HOST":
            found = (4, "HTTP_HOST")
        elif upper == b"TRANSFER-ENCODING":
            found = (6, "HTTP_TRANSFER_ENCODING")
        elif b"_" in upper:
            found = (5, "HTTP_" + text.replace("-", "_"))
        else:
            found = (0, "HTTP_" + text.replace("-", "_"))
        if upper in self.scheme_headers:
            found = (found[0] + 10, found[1])
        if len(self.header_keys) >= HEADER_KEYS_MAX:
            self.header_keys.clear()
        self.header_keys[name] = found
        return found

    def environ_build(self, conn: Connection, req: Request) -> dict:
        """The WSGI environ of ``req``'s head (PEP 3333), with the server's checks of it."""
        env = conn.base_environ.copy()
        keys = self.header_keys
        scheme = None
        seen_host = False
        repeated = None
        for name, value in req.headers:
            kind, key = keys.get(name) or self._header_key(name)
            text = value.decode("latin-1").strip(" \t")
            if kind >= 10:  # a scheme header (secure_scheme_headers), from a trusted peer only
                kind -= 10
                if conn.trusted:
                    wanted = self.scheme_headers[name.upper()]
                    this = "https" if text == wanted else "http"
                    if scheme is not None and this != scheme:
                        raise HttpError(400, "contradictory scheme headers")
                    scheme = this
            if kind:
                if kind == 1:
                    env[key] = text
                    req.length = int(text) if text.isdigit() else None
                    continue
                if kind == 2:
                    if key in env:
                        raise HttpError(400, "repeated Content-Type")
                    env[key] = text
                    continue
                if kind == 3:
                    if text.lower() == "100-continue":
                        req.expect_continue = req.version != "1.0"
                    else:
                        raise HttpError(417, f"unsupported expectation {text!r}")
                elif kind == 4:
                    if seen_host:
                        raise HttpError(400, "repeated Host")
                    seen_host = True
                elif kind == 5:
                    if self.header_map == "refuse":
                        raise HttpError(400, f"header name with an underscore: {name!r}")
                    if self.header_map != "dangerous":
                        continue
                elif kind == 6:
                    req.chunked = "chunked" in text.lower()
            if key in env:
                if repeated is None:
                    repeated = {}
                repeated.setdefault(key, [env[key]]).append(text)
            else:
                env[key] = text
        if repeated:
            for key, values in repeated.items():
                env[key] = ",".join(values)
        if scheme is not None:
            env["wsgi.url_scheme"] = scheme
        url = req.url
        if url[:1] == b"/":
            path, _, query = url.partition(b"?")
        elif url == b"*":
            path, query = url, b""
        else:  # the absolute form (a proxy's request)
            try:
                parsed = httptools.parse_url(url)
            except httptools.HttpParserInvalidURLError:
                raise HttpError(400, "invalid request target") from None
            path, query = parsed.path or b"/", parsed.query or b""
        path = path.partition(b"#")[0]
        path_info = (unquote_to_bytes(path) if b"%" in path else path).decode("latin-1")
        if self.script_name:
            if not path_info.startswith(self.script_name):
                raise HttpError(400, "the path is outside SCRIPT_NAME")
            path_info = path_info[len(self.script_name):]
        env["REQUEST_METHOD"] = req.method
        env["PATH_INFO"] = path_info
        env["QUERY_STRING"] = query.decode("latin-1")
        env["RAW_URI"] = url.decode("latin-1")
        env["SERVER_PROTOCOL"] = "HTTP/" + req.version
        env["broker.client_gone"] = req.client_gone
        return env

    def wsgi_submit(self, conn: Connection, req: Request) -> None:
        """Run the WSGI application for ``req`` in a pool thread (``runner``: ``web.server.wsgi.wsgi_call``)."""
        self.wsgi_busy += 1
        self.executor.submit(self.runner, self, conn, req)

    def wsgi_done(self) -> None:
        self.wsgi_busy -= 1


class _Errors:
    """``wsgi.errors``: the server's error log."""

    def write(self, text: str) -> None:
        logger.error(text.rstrip("\n"))

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass


_ERRORS = _Errors()
