"""The callback HTTP client: aiohttp on one asyncio event loop thread, for callbacks only.

Why aiohttp and not requests (or http.client) in a thread pool: CPU is what bounds deliveries per
second. Measured on the 2-core machine against a loopback receiver, a keep-alive POST costs
~900 us of CPU through ``requests.Session`` (~270 us through urllib3, ~170 us through
``http.client``), so requests alone could not reach the 1,500 deliveries/s target on 2 cores
next to PostgreSQL and the web workers; aiohttp parses answers in C (llhttp), keeps connections
alive and runs hundreds of concurrent callbacks on one loop thread without 64 threads fighting
over the GIL. It replaced a hand-written HTTP/1.1 protocol here, because well-kept libraries are
preferred to hand-written protocol code. The price, measured with ``bench/push.py --messages 4000``
(5 consumers): dispatcher CPU per delivery 378 us with aiohttp against 153 us with the hand-written
client, 1,796 against 2,757 deliveries/s; still above the 1,500/s target.

What this module adds on top of one ``aiohttp.ClientSession``: POST with a body and only the
headers the dispatcher gives (plus Host and Content-Length; no User-Agent, Accept, Accept-Encoding
or Content-Type of aiohttp's own), keep-alive reuse, TLS with certificate verification and SNI, no
proxies or cookies taken from the environment or earlier answers, one total deadline per attempt
(connect + send + answer), no redirects followed (a 3xx is an answer like any other), answers not
decompressed, and at most ``MAX_BODY`` bytes of an answer kept (a longer one closes the connection
instead of being drained). A POST on a kept-alive connection that the server closed meanwhile is not
retried here (aiohttp retries only idempotent methods, and detecting reuse through a TraceConfig
cost ~190 us of CPU per POST): it fails as ConnectionResetError and the dispatcher's own retry
schedule takes it. aiohttp's exceptions are mapped to the ones the dispatcher
classifies: TimeoutError, OSError (ssl.SSLError for TLS failures) and ``ProtocolError``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from urllib.parse import quote

import aiohttp
from yarl import URL

logger = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
MAX_HEAD = 64 * 1024
IDLE_LIMIT = 30.0  # seconds an idle connection is kept for reuse

# Headers aiohttp would add by itself; the dispatcher sets what it wants (User-Agent, Content-Type).
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


class ProtocolError(Exception):
    """The server's answer is not valid HTTP/1.x."""


class Answer:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict, body: bytes):
        self.status = status
        self.headers = headers  # lower-case str names -> str values
        self.body = body


def _ascii_path(path: str) -> str:
    if not path.startswith("/"):
        path = "/" + path
    if path.isascii():
        return path
    return quote(path, safe="/?&=%:@!$'()*+,;~-._")


def _header_value(value: str) -> str:
    """No CR/LF (aiohttp refuses them); aiohttp sends str values as UTF-8, while WSGI decoded the
    producer's header bytes as latin-1: turn such a value back into the text of its original bytes."""
    value = value.replace("\r", " ").replace("\n", " ")
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


class Client:
    """The event loop thread and its aiohttp session. ``submit`` is called from other threads;
    ``post`` runs on the loop thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None
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
        async def _close():
            if self._session is not None:
                await self._session.close()
                self._session = None

        if self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_close(), self.loop).result(timeout=5)
            except Exception:  # noqa: BLE001 - stopping anyway
                logger.debug("closing the push HTTP session failed", exc_info=True)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)

    def _get_session(self) -> aiohttp.ClientSession:
        """The one session, created on the loop thread at first use."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=IDLE_LIMIT,
                                             ssl=ssl.create_default_context())
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, auto_decompress=False,
                skip_auto_headers=SKIP_AUTO_HEADERS, cookie_jar=aiohttp.DummyCookieJar(),
                max_line_size=MAX_HEAD, max_field_size=MAX_HEAD)
        return self._session

    async def post(self, *, scheme: str, host: str, port: int, path: str, headers: dict, body: bytes,
                   timeout: float) -> Answer:
        """One POST with a total deadline of ``timeout`` seconds. Raises TimeoutError, OSError,
        ssl.SSLError or ProtocolError."""
        session = self._get_session()
        netloc = f"[{host}]" if ":" in host else (host if host.isascii() else host.encode("idna").decode("ascii"))
        url = URL(f"{scheme}://{netloc}:{port}{_ascii_path(path)}", encoded=True)
        headers = {name: _header_value(value) for name, value in headers.items()}
        try:
            async with asyncio.timeout(timeout):
                return await self._exchange(session, url, headers, body, timeout)
        except (TimeoutError, asyncio.TimeoutError) as exc:  # aiohttp.ServerTimeoutError included
            raise TimeoutError(f"no answer within {timeout:g}s") from exc
        except aiohttp.ClientConnectorCertificateError as exc:
            raise exc.certificate_error from exc
        except aiohttp.ClientConnectorError as exc:  # refused, unreachable, DNS, TLS handshake
            raise exc.os_error from exc
        except aiohttp.ServerDisconnectedError as exc:
            raise ConnectionResetError(f"server closed the connection {exc.message}") from exc
        except aiohttp.ClientOSError as exc:
            raise OSError(*exc.args) from exc  # errno-specific subclass, e.g. ConnectionResetError
        except aiohttp.ClientError as exc:  # ClientResponseError, ClientPayloadError, ...
            raise ProtocolError(f"invalid HTTP answer: {exc}") from exc

    @staticmethod
    async def _exchange(session, url, headers, body, timeout) -> Answer:
        async with session.post(url, data=body, headers=headers, allow_redirects=False,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            chunks, size = [], 0
            while size < MAX_BODY:
                chunk = await resp.content.read(MAX_BODY - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size >= MAX_BODY and not resp.content.at_eof():
                resp.close()  # too long to read to the end: give up the connection
            answer = Answer(resp.status, {name.lower(): value for name, value in resp.headers.items()},
                            b"".join(chunks))
        return answer
