"""Trace context (W3C trace-context, version 00; issue 25) and the optional OpenTelemetry spans.

A message carries one trace from the producer through the queue to the consumer: the publish
reads ``traceparent`` / ``tracestate`` (``trace_context_parse``), a message without a valid one
starts a new trace (``trace_new``), the pair is stored with the message, and every delivery attempt
sends a ``traceparent`` with the message's trace id and a span id of its own (``traceparent_child``).

An invalid ``traceparent`` is ignored and a new trace started, as the W3C recommendation says a
receiver must (``restart the trace``) rather than refuse the request: tracing must never cost a
producer a message. Its ``tracestate`` is dropped with it.

OpenTelemetry is optional (the ``[otel]`` extra) and configured only through its standard
``OTEL_*`` environment variables (``settings.OTEL_TRACING`` says whether any asks for traces). When
it is not configured nothing of the SDK is imported and ``span_start`` returns None at the cost of
one attribute read; when it is, the SDK is imported on the first span of each process (after a
fork, so gunicorn and django-q2 workers each export their own) and spans are exported in batches.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass

from django.conf import settings

logger = logging.getLogger(__name__)

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
TRACESTATE_MAX = 512  # characters stored and forwarded (W3C: at least 512 should be propagated)
TRACESTATE_MEMBERS_MAX = 32
_TRACESTATE_MEMBER = re.compile(r"[a-z0-9][a-z0-9_\-*/@]{0,255}=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
SAMPLED = "01"


@dataclass(frozen=True)
class TraceContext:
    """A message's trace context as stored: its ``traceparent`` (version 00) and ``tracestate``."""

    traceparent: str
    tracestate: str = ""

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]


def traceparent_valid(raw) -> str | None:
    """A ``traceparent`` header as version 00 (``00-<32 hex trace id>-<16 hex parent id>-<2 hex
    flags>``), or None when it is not valid: wrong shape, upper-case hex, version ff, an all-zero
    id, or a version-00 value with anything after it. A higher version is read by its first four
    fields (a ``-`` must follow them), as the recommendation asks."""
    if not isinstance(raw, str):
        return None
    value = raw.strip()
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    if len(value) > 55 and (version == "00" or value[55] != "-"):
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def tracestate_valid(raw) -> str:
    """A ``tracestate`` worth forwarding: at most 32 list members of ``key=value``, 512 characters;
    anything else is dropped (""), as the recommendation allows."""
    if not isinstance(raw, str):
        return ""
    members = [m.strip() for m in raw.split(",") if m.strip()]
    if not members or len(members) > TRACESTATE_MEMBERS_MAX:
        return ""
    if not all(_TRACESTATE_MEMBER.fullmatch(m) for m in members):
        return ""
    value = ",".join(members)
    return value if len(value) <= TRACESTATE_MAX else ""


def trace_new() -> TraceContext:
    """A new trace: random trace and span ids, flags 01 (sampled, so a consumer whose tracer
    follows its parent's decision records its side of the trace)."""
    return TraceContext(f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-{SAMPLED}")


def trace_context_parse(traceparent, tracestate=None) -> TraceContext | None:
    """The trace context a producer sent (a header or a batch item's field); None when it sent none
    or an invalid ``traceparent`` (the caller starts a new trace)."""
    parent = traceparent_valid(traceparent)
    if parent is None:
        return None
    return TraceContext(parent, tracestate_valid(tracestate))


def traceparent_child(parent: str, span: "Span | None" = None) -> str:
    """The ``traceparent`` to send on: the parent's trace id and flags with ``span``'s id, or a
    fresh span id when no span is recorded (OpenTelemetry not configured). A message stored before
    trace context existed (no traceparent) gets a trace of its own here."""
    if span is not None:
        return span.traceparent
    if len(parent) != 55:
        return trace_new().traceparent
    return f"{parent[:36]}{secrets.token_hex(8)}{parent[52:]}"


# --- OpenTelemetry (optional) ----------------------------------------------------------------------

def otel_configured(environ) -> bool:
    """Do the standard OTEL_* variables ask for traces? An exporter endpoint, or a traces exporter
    other than none; never with OTEL_SDK_DISABLED=true."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


class Span:
    """A recorded OpenTelemetry span and the ``traceparent`` that names it."""

    def __init__(self, span) -> None:
        self._span = span
        ctx = span.get_span_context()
        self.traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def end(self, *, error: str = "", end_ns: int | None = None, **attributes) -> None:
        for key, value in attributes.items():
            if value is not None:
                self._span.set_attribute(key, value)
        if error:
            self._span.set_status(_otel.Status(_otel.StatusCode.ERROR, error[:200]))
        self._span.end(end_time=end_ns)


class _Otel:
    """The SDK's pieces, imported and set up on first use in a process (``_otel_load``)."""

    pid = 0
    tracer = None
    propagator = None
    kinds: dict = {}
    Status = None
    StatusCode = None


_otel = _Otel()
_otel_lock = threading.Lock()


def _exporter():
    """The span exporter OTEL_TRACES_EXPORTER names (otlp by default, or console), over the protocol
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL names (http/protobuf by default,
    or grpc); the exporters read their endpoint, headers and timeout from OTEL_* themselves."""
    name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower().split(",")[0] or "otlp"
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter  # the [otel] extra, optional

        return ConsoleSpanExporter()
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # optional extra
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # optional extra
    return OTLPSpanExporter()


def _otel_load() -> _Otel | None:
    """The process's tracer, set up on first use (and again in a forked child, whose batch thread
    did not survive the fork); None when the SDK is not installed (logged once)."""
    if _otel.pid == os.getpid():
        return _otel if _otel.tracer is not None else None
    with _otel_lock:
        if _otel.pid == os.getpid():
            return _otel if _otel.tracer is not None else None
        _otel.pid = os.getpid()
        try:
            # the [otel] extra, optional: imported only when OTEL_* configures tracing
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind, Status, StatusCode
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            logger.warning("OTEL_* asks for traces but the OpenTelemetry SDK is not installed "
                           "(pip install 'django-message-broker[otel]'); no spans are exported")
            return None
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "message-broker"}
        provider = TracerProvider(resource=Resource.create(attributes))
        provider.add_span_processor(BatchSpanProcessor(_exporter()))
        _otel.tracer = provider.get_tracer("broker")
        _otel.propagator = TraceContextTextMapPropagator()
        _otel.kinds = {"producer": SpanKind.PRODUCER, "client": SpanKind.CLIENT, "consumer": SpanKind.CONSUMER,
                       "internal": SpanKind.INTERNAL}
        _otel.Status, _otel.StatusCode = Status, StatusCode
        return _otel


def span_start(name: str, *, parent: TraceContext | None, kind: str = "internal",
               start_ns: int | None = None, attributes: dict | None = None) -> Span | None:
    """Start a span in ``parent``'s trace (a root span when None); None when OpenTelemetry is not
    configured (no import, no work) or a span cannot be made (tracing never fails the broker)."""
    if not settings.OTEL_TRACING:
        return None
    try:
        otel = _otel_load()
        if otel is None:
            return None
        carrier = {}
        if parent is not None and parent.traceparent:
            carrier["traceparent"] = parent.traceparent
            if parent.tracestate:
                carrier["tracestate"] = parent.tracestate
        context = otel.propagator.extract(carrier) if carrier else None
        span = otel.tracer.start_span(name, context=context, kind=otel.kinds.get(kind),
                                      attributes={k: v for k, v in (attributes or {}).items() if v is not None},
                                      start_time=start_ns if start_ns is not None else time.time_ns())
        return Span(span)
    except Exception:  # noqa: BLE001 - tracing must never fail a publish or a delivery
        logger.exception("could not start span %s", name)
        return None
