"""``BrokerWorker``: the gunicorn worker class of gunicorn.conf.py (``worker_class``).

gunicorn's master stays as it is (binding, forking, restarting workers, its heartbeat check, the
control socket, signals, ``max_requests``); each worker runs ``web.server.http.Server`` on a uvloop
event loop over the inherited listening sockets, with BROKER_WEB_THREADS (gunicorn's ``threads``)
threads for the WSGI application. SIGTERM: stop accepting, finish the requests being answered
within ``graceful_timeout``, exit; SIGINT / SIGQUIT: exit now. The worker tells the master it is
alive from the event loop's clock, so a loop that stops turning is restarted after ``timeout``.

This module is imported by gunicorn's master before Django is configured: nothing here may load
Django's settings at import; the native routes (``settings.BROKER_NATIVE_ROUTES``, a dotted path)
are loaded in the worker, after the application.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import signal
import sys
import time

import uvloop
from django.conf import settings
from django.utils.module_loading import import_string
from gunicorn.sock import ssl_context
from gunicorn.workers import base

from broker.heap import heap_freeze
from web.server.http import Limits, Request, Server
from web.server.wsgi import wsgi_call

HEARTBEAT = 1.0  # seconds between two signs of life to the master


class _Access:
    """What gunicorn's access log formatter reads of an answer (``glogging.Logger.atoms``)."""

    __slots__ = ("status", "headers", "sent")

    def __init__(self, req: Request) -> None:
        self.status = str(req.status)
        self.headers = []
        self.sent = req.sent


class BrokerWorker(base.Worker):
    """gunicorn worker: uvloop + httptools, native routes on the loop, WSGI in a thread pool."""

    def init_process(self) -> None:
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.server: Server | None = None
        self._quick = False
        self._beat = 0.0
        super().init_process()

    def init_signals(self) -> None:
        # gunicorn's handlers are replaced by the event loop's (run); until then, the defaults
        for sig in self.SIGNALS:
            signal.signal(sig, signal.SIG_DFL)

    def run(self) -> None:
        loop = self.loop
        loop.add_signal_handler(signal.SIGTERM, self._stop, False)
        loop.add_signal_handler(signal.SIGINT, self._stop, True)
        loop.add_signal_handler(signal.SIGQUIT, self._stop, True)
        loop.add_signal_handler(signal.SIGABRT, self._abort)
        loop.add_signal_handler(signal.SIGUSR1, self.log.reopen_files)
        loop.add_signal_handler(signal.SIGWINCH, lambda: None)
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    def _stop(self, quick: bool) -> None:
        if quick:
            self.cfg.worker_int(self)
        self._quick = self._quick or quick
        self.alive = False

    def _abort(self) -> None:
        self.alive = False
        self.cfg.worker_abort(self)
        sys.exit(1)

    def _limits(self) -> Limits:
        cfg = self.cfg
        return Limits(keepalive=float(cfg.keepalive or 0) or 2.0,
                      request_line=cfg.limit_request_line or 8190,
                      header_fields=cfg.limit_request_fields or 32768,
                      header_field_size=cfg.limit_request_field_size or 8190)

    async def _serve(self) -> None:
        cfg = self.cfg
        django = settings.configured or bool(os.environ.get("DJANGO_SETTINGS_MODULE"))
        route_table = (getattr(settings, "BROKER_NATIVE_ROUTES", "") if django else "") or ""
        native = import_string(route_table)() if route_table else None
        if django and settings.BROKER_GC_FREEZE:
            heap_freeze()  # what the worker loaded, out of the collector's full passes (broker.heap)
        networks = cfg.forwarded_allow_networks()
        allow_all = "*" in cfg.forwarded_allow_ips

        def forwarded(address: str) -> bool:
            if allow_all:
                return True
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                return False
            return any(ip in network for network in networks)

        self.server = server = Server(
            app=self.wsgi, loop=self.loop, threads=cfg.threads, limits=self._limits(), native=native,
            scheme_headers=cfg.secure_scheme_headers, forwarded=forwarded, header_map=cfg.header_map,
            multiprocess=cfg.workers > 1, ssl_context=ssl_context(cfg) if cfg.is_ssl else None,
            access_log=self._access if self.log.access_log_enabled else None, runner=wsgi_call,
            script_name=os.environ.get("SCRIPT_NAME", ""))
        if native is not None:
            native.attach(server)
        await server.start([listener.sock for listener in self.sockets])
        self.notify()
        while self.alive:
            await asyncio.sleep(HEARTBEAT)
            self.notify()
            if self.ppid != os.getppid():
                self.log.info("Parent changed, shutting down: %s", self)
                break
            if server.requests_done >= self.max_requests:
                self.log.info("Autorestarting worker after current request.")
                break
        self.alive = False
        await server.shutdown(0.0 if self._quick else float(cfg.graceful_timeout))
        if native is not None:
            native.detach()

    def _access(self, req: Request) -> None:
        """One access-log line (only when BROKER_ACCESS_LOG is set: gunicorn.conf.py's logger)."""
        took = datetime.timedelta(seconds=max(0.0, time.monotonic() - req.started))
        environ = req.environ or {}
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in req.headers]
        try:
            self.log.access(_Access(req), headers, environ, took)
        except Exception:  # noqa: BLE001 - a log line must never fail a request
            self.log.exception("access log failed")

