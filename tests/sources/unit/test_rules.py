"""The pure rules of a source: its fields, the rules across them, the specs that read a delivery id
or a type out of a request."""

from __future__ import annotations

import pytest

from broker.errors import InvalidInput
from sources.rules import (Body, SourceState, delivery_shown, dedupe_spec, json_path, settings_check, settings_parse,
                           spec_parse, spec_read, type_spec, DEDUPE_KINDS, TYPE_KINDS)


def code_of(fn, *args, **kwargs) -> str:
    with pytest.raises(InvalidInput) as info:
        fn(*args, **kwargs)
    return info.value.code


def test_fields_parse_to_model_fields():
    fields = settings_parse({"verify": " GitHub ", "secret": "s", "dedupe": "json:a.b", "dedupeWindow": "90m",
                             "messageType": "value:order.created", "responseStatus": "202", "enabled": "false",
                             "algorithm": None, "unknown": "x"})
    assert fields == {"verify": "github", "secret": "s", "dedupe": "json:a.b", "dedupe_window": 5400,
                      "message_type": "value:order.created", "response_status": 202, "enabled": False}
    assert settings_parse({"dedupe": "", "messageType": " ", "secret": ""}) == {"dedupe": None, "message_type": None}


@pytest.mark.parametrize(("raw", "code"), [
    ({"verify": "gitlab"}, "invalid_verify"),
    ({"dedupe": "header:"}, "invalid_dedupe"),
    ({"dedupe": "header:X Y"}, "invalid_dedupe"),
    ({"dedupe": "value:x"}, "invalid_dedupe"),
    ({"messageType": "body"}, "invalid_messageType"),
    ({"messageType": "value:has space"}, "invalid_messageType"),
    ({"messageType": "json:a..b"}, "invalid_messageType"),
    ({"dedupeWindow": "31d"}, "invalid_dedupeWindow"),
    ({"dedupeWindow": "0"}, "invalid_dedupeWindow"),
    ({"dedupeWindow": "soon"}, "invalid_dedupeWindow"),
    ({"responseStatus": "302"}, "invalid_responseStatus"),
    ({"responseStatus": "2OO"}, "invalid_responseStatus"),
    ({"algorithm": "md5"}, "invalid_algorithm"),
    ({"encoding": "base32"}, "invalid_encoding"),
    ({"signatureHeader": "X:Sig"}, "invalid_signatureHeader"),
    ({"secret": "x" * 1025}, "invalid_secret"),
    ({"enabled": "maybe"}, "invalid_enabled"),
])
def test_bad_fields_are_refused_by_name(raw, code):
    assert code_of(settings_parse, raw) == code


def state(verify="github", secret="", header="", key=""):
    return SourceState(verify=verify, secret=secret, signature_header=header, api_key_header=key)


def test_rules_across_fields():
    settings_check(new=state("none"), old=None, fields={"verify": "none"})
    settings_check(new=state("github", "s"), old=None, fields={"verify": "github", "secret": "s"})
    assert code_of(settings_check, new=state("github"), old=None, fields={"secret": "s"}) == "verify_required"
    assert code_of(settings_check, new=state("github"), old=None, fields={"verify": "github"}) == "secret_required"
    # an update keeps the secret, unless verify changes: the old one meant another scheme
    settings_check(new=state("github", "s"), old=state("github", "s"), fields={"dedupe": None})
    assert code_of(settings_check, new=state("stripe", "s"), old=state("github", "s"),
                   fields={"verify": "stripe"}) == "secret_required"
    assert code_of(settings_check, new=state("hmac", "s"), old=None,
                   fields={"verify": "hmac", "secret": "s"}) == "signature_header_required"
    assert code_of(settings_check, new=state("basic", "nocolon"), old=None,
                   fields={"verify": "basic", "secret": "nocolon"}) == "invalid_secret"
    assert code_of(settings_check, new=state("standard-webhooks", "whsec_***"), old=None,
                   fields={"verify": "standard-webhooks", "secret": "whsec_***"}) == "invalid_secret"
    settings_check(new=state("standard-webhooks", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), old=None,
                   fields={"verify": "standard-webhooks", "secret": "x"})


def test_presets_and_specs():
    assert dedupe_spec(None, "github") == "header:X-GitHub-Delivery" and dedupe_spec(None, "hmac") == "none"
    assert type_spec(None, "slack") == "json:event.type" and type_spec("value:x", "slack") == "value:x"
    assert spec_parse("Header:X-Id", kinds=DEDUPE_KINDS, field="dedupe") == ("header", "X-Id")
    assert spec_parse("json:a b.c", kinds=DEDUPE_KINDS, field="dedupe") == ("json", "a b.c")
    assert spec_parse("body", kinds=DEDUPE_KINDS, field="dedupe") == ("body", "")
    assert code_of(spec_parse, "body", kinds=TYPE_KINDS, field="messageType") == "invalid_messageType"


def test_spec_read():
    body = Body(b'{"id": "evt_1", "n": 7, "event": {"type": "app_mention"}, "items": [{"sku": "a"}], "f": true}')
    headers = {"x-github-delivery": " 72d3 "}
    assert spec_read(("header", "X-GitHub-Delivery"), headers, body) == "72d3"
    assert spec_read(("header", "X-Other"), headers, body) is None
    assert spec_read(("json", "id"), headers, body) == "evt_1"
    assert spec_read(("json", "n"), headers, body) == "7"
    assert spec_read(("json", "event.type"), headers, body) == "app_mention"
    assert spec_read(("json", "items.0.sku"), headers, body) == "a"
    assert spec_read(("json", "event"), headers, body) is None  # not a scalar
    assert spec_read(("json", "f"), headers, body) is None
    assert spec_read(("value", "x.y"), headers, body) == "x.y"
    assert spec_read(("none", ""), headers, body) is None
    assert spec_read(("body", ""), headers, Body(b"abc")).startswith("sha256:ba7816bf")
    assert spec_read(("json", "id"), headers, Body(b"not json")) is None
    assert json_path([1, 2], "5") is None


def test_a_delivery_id_is_shown_as_is_or_as_its_hash():
    assert delivery_shown("evt_1") == "evt_1"
    assert delivery_shown("a\nb").startswith("sha256:") and delivery_shown("x" * 300).startswith("sha256:")
