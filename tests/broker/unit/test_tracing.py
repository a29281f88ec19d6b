"""W3C trace context rules (broker.tracing, issue 25): which traceparent / tracestate values are
kept, what a new trace and a child span id look like, when OTEL_* asks for span export."""

from __future__ import annotations

import re

import pytest

from broker.tracing import (otel_configured, trace_context_parse, trace_new, traceparent_child, traceparent_valid,
                            tracestate_valid)

pytestmark = pytest.mark.unit

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("raw, kept", [
    (TP, TP),
    (f"  {TP} ", TP),
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future", TP),  # a higher version: its first fields
    (TP + "-extra", None),  # version 00 with anything after it
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
    ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", None),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01", None),
    (TP.upper(), None),
    ("00-xyz-01", None), ("", None), (None, None), (42, None),
])
def test_traceparent_valid(raw, kept):
    assert traceparent_valid(raw) == kept


def test_tracestate_kept_only_when_well_formed():
    assert tracestate_valid("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE") == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    assert tracestate_valid(",".join(f"k{i}=v" for i in range(33))) == ""  # over 32 members
    assert tracestate_valid("no equals sign") == "" and tracestate_valid(None) == ""
    assert trace_context_parse("garbage", "k=v") is None
    assert trace_context_parse(TP, "k=v").tracestate == "k=v"


def test_new_trace_and_child_span_ids():
    a, b = trace_new(), trace_new()
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", a.traceparent) and a.trace_id != b.trace_id
    child = traceparent_child(TP)
    assert child[:36] == TP[:36] and child[-3:] == "-01" and child[36:52] != TP[36:52]
    assert traceparent_child(TP) != child  # a span id of its own per attempt
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", traceparent_child(""))  # a message stored before


@pytest.mark.parametrize("environ, on", [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
])
def test_otel_configured_by_the_standard_variables(environ, on):
    assert otel_configured(environ) is on
