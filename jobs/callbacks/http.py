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

What it does: POST with a body, keep-alive reuse per (scheme, host, port), TLS with certificate
verification and SNI, one total deadline per attempt (connect + send + full answer), no
redirects followed (a 3xx is an answer like any other), 1xx interim answers skipped, bodies by
Content-Length, chunked or until close, at most ``MAX_HEAD`` bytes of header section and
``MAX_BODY`` bytes of body kept (a longer body closes the connection). A connection goes back to
the pool only after a complete keep-alive answer with nothing after it. A request on a
kept-alive connection that the server had already closed is retried once on a new connection
(nothing was received, so nothing was processed).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
import time
from collections import defaultdict
from urllib.parse import quote

import httptools

from broker import netpolicy

logger = logging.getLogger(__name__)
MAX_BODY = 64 * 1024
MAX_HEAD = 64 * 1024
MAX_ANSWER = MAX_HEAD + 8 * MAX_BODY  # raw bytes of one answer before its body is settled
IDLE_LIMIT = 30.0  # seconds an idle connection is kept for reuse


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


class Client:
    """The event loop thread and its keep-alive connections. ``post`` is called from other
    threads; ``on_done(job, target, answer_or_error, started, finished)`` runs on the loop thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._idle: dict[tuple, list[Connection]] = defaultdict(list)
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
        if conn.reusable and not conn.closed:
            conn.idle_since = time.monotonic()
            self._idle[conn.key].append(conn)
        else:
            conn.close()

    async def post(self, *, scheme: str, host: str, port: int, path: str, headers: dict, body: bytes,
                   timeout: float) -> Answer:
        """One POST with a total deadline of ``timeout`` seconds. Raises TimeoutError, OSError,
        ssl.SSLError or ProtocolError."""
        host_header = f"[{host}]" if ":" in host else host
        if (scheme, port) not in (("http", 80), ("https", 443)):
            host_header = f"{host_header}:{port}"
        lines = [b"POST " + _ascii_path(path) + b" HTTP/1.1", b"Host: " + host_header.encode("idna"),
                 b"Content-Length: " + str(len(body)).encode()]
        lines += [name.encode("latin-1") + b": " + _header_bytes(value) for name, value in headers.items()]
        data = b"\r\n".join(lines) + b"\r\n\r\n" + body
        key = (scheme, host, port)
        conn = None
        try:
            async with asyncio.timeout(timeout):
                for attempt in (1, 2):
                    conn = self._reuse(key)
                    reused = conn is not None
                    if conn is None:
                        conn = await self._connect(scheme, host, port)
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
        finally:
            if conn is not None:
                conn.close()  # timed out or failed mid-exchange: the connection's state is unknown
        raise ConnectionResetError("unreachable")  # pragma: no cover
