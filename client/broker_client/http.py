"""One HTTP transport for producers and consumers: a ``requests`` session per thread, optional
request signing (``BROKER_HMAC_SECRET``), and retries of 429 / 502 / 503 / 504 and connection
errors that honour ``Retry-After``.

Retries are only safe for idempotent calls; the callers here make them idempotent (a publish
always carries its message id, acks and progress can be repeated), and tell ``Transport.call``
whether an attempt was a retry, so a 409 on a retried publish can be read as its own success.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json as jsonlib
import os
import random
import threading
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import quote

import requests

from broker_client.errors import BrokerError, error_from_response

RETRY_STATUSES = frozenset({429, 502, 503, 504})
USER_AGENT = "broker-client/0.1 (python-requests)"
TEMPLATES_MAX = 64


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures are retried: at most ``attempts`` retries; a ``Retry-After`` is
    honoured as given unless it is longer than ``max_wait`` (then the error is raised at once,
    carrying ``retry_after``); without one the waits grow from ``backoff`` to ``max_backoff``."""

    attempts: int = 5
    max_wait: float = 60.0
    backoff: float = 0.5
    max_backoff: float = 10.0

    def wait_for(self, retry: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number ``retry`` (1-based); None: give up."""
        if retry > self.attempts:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_wait else None
        step = min(self.max_backoff, self.backoff * 2 ** (retry - 1))
        return step * random.uniform(0.8, 1.2)


NO_RETRY = RetryPolicy(attempts=0)


def retry_after_parse(value: str | None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date; None when absent or invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


def server_time(response) -> float | None:
    """The broker's clock at the answer (``Date``, whole seconds, so + 0.5 as the best guess);
    None without the header. Used to turn job deadlines into local lease lengths."""
    value = response.headers.get("Date")
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp() + 0.5
    except (TypeError, ValueError, IndexError):
        return None


def path_segment(value: str) -> str:
    """An id as one URL path segment (ids are opaque strings: never parsed, always quoted)."""
    return quote(str(value), safe="-_.~")


class HmacAuth(requests.auth.AuthBase):
    """``X-Broker-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`` on every request,
    for brokers running with ``BROKER_HMAC_SECRET`` (base64)."""

    def __init__(self, secret_b64: str):
        self.key = base64.b64decode(secret_b64, validate=True)

    def __call__(self, request):
        stamp = int(time.time())
        body = request.body or b""
        if isinstance(body, str):
            body = body.encode("utf-8")
        mac = hmac.new(self.key, f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
        request.headers["X-Broker-Signature"] = f"t={stamp},v1={mac}"
        return request


class Transport:
    """Base URL, fixed headers, timeouts and the retry policy of one client object. Each thread
    gets its own ``requests.Session`` (keep-alive connections; sessions are not thread-safe)."""

    def __init__(self, base_url: str, headers: dict, *, timeout: float = 30.0, retry: RetryPolicy | None = None,
                 hmac_secret: str | None = None, verify=True):
        if not base_url or "://" not in base_url:
            raise ValueError(f"base_url must be an absolute URL such as http://127.0.0.1:8080, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.headers = {"User-Agent": USER_AGENT, **headers}
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.auth = HmacAuth(hmac_secret) if hmac_secret else None
        # The environment's proxy and CA settings are read once here, not on every request
        # (requests re-reads os.environ and ~/.netrc per request: ~10% of a consumer's CPU).
        self.proxies = requests.utils.get_environ_proxies(self.base_url)
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        self.verify = bundle if verify is True and bundle else verify
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()
        self._templates: dict[tuple[str, str], requests.PreparedRequest] = {}

    def session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            s.headers.update(self.headers)
            s.auth = self.auth
            s.verify = self.verify
            s.trust_env = False
            s.proxies.update(self.proxies)
            self._local.session = s
            with self._lock:
                self._sessions.append(s)
        return s

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for s in sessions:
            s.close()
        self._local = threading.local()

    def prepared(self, method: str, url: str, body: bytes | None, headers: dict | None) -> requests.PreparedRequest:
        """The request, from a prepared template per method and URL: ``Session.request`` would
        merge settings, headers and cookies again for every call (a fifth of a consumer's CPU).
        The broker's API sets no cookies; only fixed URLs are kept (job URLs are built fresh)."""
        key = (method, url)
        template = self._templates.get(key)
        if template is None:
            template = requests.Request(method, url, headers=self.headers).prepare()
            if len(self._templates) < TEMPLATES_MAX:
                self._templates[key] = template
        request = template.copy()
        if headers:
            request.headers.update(headers)
        if body is not None:
            request.prepare_body(body, None)
        return self.auth(request) if self.auth else request

    def call(self, method: str, path: str, *, json=None, data: bytes | None = None, headers: dict | None = None,
             retry: RetryPolicy | None = None, ok=(200, 201, 202, 204), accept=(), timeout=None,
             wait=None) -> tuple[requests.Response, int]:
        """One request with retries; returns (response, number of earlier attempts). Status codes
        in ``ok`` and ``accept`` are returned; any other is raised as a ``BrokerError`` subclass.
        ``json`` is sent as a JSON body, ``data`` as raw bytes. ``wait(seconds)`` sleeps between
        attempts (a consumer passes its stop event's wait, so a stop is not held up by a
        Retry-After). Redirects are not followed (the broker's API never redirects)."""
        policy = retry or self.retry
        url = self.base_url + path
        if json is not None:
            data = jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
            headers = {**(headers or {}), "Content-Type": "application/json"}
        tries = 0
        while True:
            try:
                session = self.session()
                response = session.send(self.prepared(method, url, data, headers), timeout=timeout or self.timeout,
                                        allow_redirects=False)
            except (requests.ConnectionError, requests.Timeout) as exc:
                pause = policy.wait_for(tries + 1, None)
                if pause is None:
                    raise
                error: Exception = exc
            else:
                if response.status_code in ok or response.status_code in accept:
                    return response, tries
                retry_after = retry_after_parse(response.headers.get("Retry-After"))
                error = error_from_response(response, retry_after=retry_after)
                pause = policy.wait_for(tries + 1, retry_after) if response.status_code in RETRY_STATUSES else None
                if pause is None:
                    raise error
            tries += 1
            if wait is not None:
                if wait(pause):  # stop requested: give up now with the last error
                    raise error
            else:
                time.sleep(pause)


class Client:
    """What producers and consumers share: a ``transport``, ``close()`` and ``with`` support."""

    transport: Transport

    def close(self) -> None:
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def is_transient(exc: BaseException) -> bool:
    """A failure worth trying again later (a consumer keeps going; a producer's retries ran out)."""
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return True
    return isinstance(exc, BrokerError) and exc.status in RETRY_STATUSES
