"""Each verify preset against the provider's own published example or library: GitHub's documented
test vector, the ``stripe`` package's ``Webhook.construct_event`` agreeing with what the broker
accepts, the ``standardwebhooks`` package's signing; Slack's and Shopify's documented formats; and
the configurable hmac, basic and api-key. Bad, missing and stale signatures are refused with their
own codes. Pure: no database."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import datetime, timezone

import pytest
import stripe
from standardwebhooks.webhooks import Webhook

from sources.verify import HmacScheme, SignatureRefused, request_verify

NOW = time.time()


def verify(kind: str, secrets, headers: dict, body: bytes, now: float = NOW, **extra) -> None:
    request_verify(verify=kind, secrets=list(secrets), headers={k.lower(): v for k, v in headers.items()}, body=body,
                   now=now, **extra)


def refused(kind: str, secrets, headers: dict, body: bytes, **extra) -> str:
    with pytest.raises(SignatureRefused) as info:
        verify(kind, secrets, headers, body, **extra)
    assert info.value.code in ("signature_missing", "signature_invalid", "timestamp_out_of_tolerance")
    return info.value.code


# --- GitHub ------------------------------------------------------------------------------------------

# docs.github.com, "Validating webhook deliveries": "Testing the webhook payload validation"
GITHUB_SECRET = "It's a Secret to Everybody"
GITHUB_BODY = b"Hello, World!"
GITHUB_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_github_accepts_its_documented_test_vector():
    verify("github", [GITHUB_SECRET], {"X-Hub-Signature-256": GITHUB_SIGNATURE}, GITHUB_BODY)


def test_github_refuses_a_changed_body_another_secret_a_missing_or_malformed_header():
    assert refused("github", [GITHUB_SECRET], {"X-Hub-Signature-256": GITHUB_SIGNATURE}, b"Hello, World?") == "signature_invalid"
    assert refused("github", ["another"], {"X-Hub-Signature-256": GITHUB_SIGNATURE}, GITHUB_BODY) == "signature_invalid"
    assert refused("github", [GITHUB_SECRET], {}, GITHUB_BODY) == "signature_missing"
    # the old SHA-1 header alone is not enough: no fallback to a weaker scheme
    assert refused("github", [GITHUB_SECRET], {"X-Hub-Signature": "sha1=" + "0" * 40}, GITHUB_BODY) == "signature_missing"
    assert refused("github", [GITHUB_SECRET], {"X-Hub-Signature-256": GITHUB_SIGNATURE[7:]}, GITHUB_BODY) == "signature_invalid"


def test_the_previous_secret_verifies_beside_the_current_one():
    verify("github", ["new-secret", GITHUB_SECRET], {"X-Hub-Signature-256": GITHUB_SIGNATURE}, GITHUB_BODY)


# --- Stripe: the broker accepts exactly what stripe.Webhook.construct_event accepts ----------------------

STRIPE_SECRET = "whsec_test_secret_abcdefghijklmnop"
STRIPE_EVENT = json.dumps({"id": "evt_1", "object": "event", "type": "payment_intent.succeeded",
                           "data": {"object": {"id": "pi_1", "amount": 1200}}}).encode()


def _stripe_header(body: bytes, secret: str, timestamp: int) -> str:
    return stripe.WebhookSignature.generate_signature_header(body.decode(), secret, timestamp=timestamp)


def _stripe_cases():
    now = int(time.time())  # construct_event reads the clock: the cases are made when the test runs
    good = _stripe_header(STRIPE_EVENT, STRIPE_SECRET, now)
    other = _stripe_header(STRIPE_EVENT, "whsec_other", now)
    return {
        "valid": good,
        "valid among several v1": f"t={now},v1={'0' * 64},v1={good.split('v1=')[1]}",
        "with a v0 scheme beside": good + ",v0=" + "1" * 64,
        "another secret": other,
        "only v0": f"t={now},v0={good.split('v1=')[1]}",
        "no timestamp": "v1=" + good.split("v1=")[1],
        "not a timestamp": f"t=abc,v1={good.split('v1=')[1]}",
        "stale, signed": _stripe_header(STRIPE_EVENT, STRIPE_SECRET, now - 301),
        "just inside the tolerance": _stripe_header(STRIPE_EVENT, STRIPE_SECRET, now - 290),
        "stale and wrong": _stripe_header(STRIPE_EVENT, "whsec_other", now - 3600),
        "the body changed": _stripe_header(STRIPE_EVENT + b" ", STRIPE_SECRET, now),
        "empty": "",
    }


@pytest.mark.parametrize("case", list(_stripe_cases()))
def test_stripe_agrees_with_the_stripe_library(case):
    header = _stripe_cases()[case]
    try:
        stripe.Webhook.construct_event(STRIPE_EVENT, header, STRIPE_SECRET, tolerance=300)
        library = True
    except stripe.SignatureVerificationError:
        library = False
    try:
        verify("stripe", [STRIPE_SECRET], {"Stripe-Signature": header} if header else {}, STRIPE_EVENT,
               now=time.time())
        broker = True
    except SignatureRefused:
        broker = False
    assert broker == library, case


def test_stripe_refusal_codes():
    now = int(NOW)
    assert refused("stripe", [STRIPE_SECRET], {}, STRIPE_EVENT) == "signature_missing"
    stale = _stripe_header(STRIPE_EVENT, STRIPE_SECRET, now - 301)
    assert refused("stripe", [STRIPE_SECRET], {"Stripe-Signature": stale}, STRIPE_EVENT) == "timestamp_out_of_tolerance"
    wrong = _stripe_header(STRIPE_EVENT, "whsec_other", now)
    assert refused("stripe", [STRIPE_SECRET], {"Stripe-Signature": wrong}, STRIPE_EVENT) == "signature_invalid"


# --- Standard Webhooks: signed by the standardwebhooks package ----------------------------------------

WH_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _standard_headers(body: bytes, secret: str = WH_SECRET, *, ahead: float = 0.0, msg_id: str = "msg_1") -> dict:
    """Signed now (the package checks the time on its own clock), or ``ahead`` seconds off."""
    stamp = datetime.fromtimestamp(time.time() + ahead, tz=timezone.utc)
    signature = Webhook(secret).sign(msg_id, stamp, body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(stamp.timestamp())), "webhook-signature": signature}


def test_standard_webhooks_accepts_what_the_package_signs():
    body = b'{"type": "invoice.paid", "data": {"id": 1}}'
    verify("standard-webhooks", [WH_SECRET], _standard_headers(body), body)
    # several signatures, one of them right (a sender rotating its secret signs with both)
    headers = _standard_headers(body)
    headers["webhook-signature"] = "v1,AAAA " + headers["webhook-signature"]
    verify("standard-webhooks", [WH_SECRET], headers, body)
    # the secret may be given without its whsec_ prefix
    verify("standard-webhooks", [WH_SECRET[len("whsec_"):]], _standard_headers(body), body)


def test_standard_webhooks_refusals():
    body = b'{"type": "invoice.paid"}'
    headers = _standard_headers(body)
    assert refused("standard-webhooks", [WH_SECRET], {**headers, "webhook-id": "msg_2"}, body) == "signature_invalid"
    assert refused("standard-webhooks", ["whsec_" + base64.b64encode(b"x" * 24).decode()], headers, body) == "signature_invalid"
    missing = {k: v for k, v in headers.items() if k != "webhook-timestamp"}
    assert refused("standard-webhooks", [WH_SECRET], missing, body) == "signature_missing"
    stale = _standard_headers(body, ahead=-600)
    assert refused("standard-webhooks", [WH_SECRET], stale, body) == "timestamp_out_of_tolerance"
    ahead = _standard_headers(body, ahead=600)
    assert refused("standard-webhooks", [WH_SECRET], ahead, body) == "timestamp_out_of_tolerance"
    assert refused("standard-webhooks", [WH_SECRET], {**headers, "webhook-signature": "garbage"}, body) == "signature_invalid"
    assert refused("standard-webhooks", [WH_SECRET], headers, b"\xff\xfe") == "signature_invalid"


# --- Slack and Shopify, as their documentation writes the signature ---------------------------------

SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


def _slack(body: bytes, stamp: int, secret: str = SLACK_SECRET) -> dict:
    base = f"v0:{stamp}:".encode() + body
    return {"X-Slack-Request-Timestamp": str(stamp),
            "X-Slack-Signature": "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()}


def test_slack():
    body = b'{"type":"event_callback","event_id":"Ev1","event":{"type":"app_mention"}}'
    verify("slack", [SLACK_SECRET], _slack(body, int(NOW)), body)
    assert refused("slack", [SLACK_SECRET], _slack(body, int(NOW), "other"), body) == "signature_invalid"
    assert refused("slack", [SLACK_SECRET], _slack(body, int(NOW) - 301), body) == "timestamp_out_of_tolerance"
    assert refused("slack", [SLACK_SECRET], _slack(body, int(NOW) + 301), body) == "timestamp_out_of_tolerance"
    headers = _slack(body, int(NOW))
    del headers["X-Slack-Request-Timestamp"]
    assert refused("slack", [SLACK_SECRET], headers, body) == "signature_missing"
    assert refused("slack", [SLACK_SECRET], {**_slack(body, int(NOW)), "X-Slack-Request-Timestamp": "x"}, body) == "signature_invalid"


def test_shopify():
    secret, body = "hush", b'{"id": 820982911946154508, "email": "jon@example.com"}'
    header = base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()
    verify("shopify", [secret], {"X-Shopify-Hmac-Sha256": header}, body)
    assert refused("shopify", ["other"], {"X-Shopify-Hmac-Sha256": header}, body) == "signature_invalid"
    assert refused("shopify", [secret], {"X-Shopify-Hmac-Sha256": "%%%"}, body) == "signature_invalid"
    assert refused("shopify", [secret], {}, body) == "signature_missing"


# --- hmac, basic, api-key, none -----------------------------------------------------------------------

@pytest.mark.parametrize(("algorithm", "encoding", "prefix"), [
    ("sha256", "hex", ""), ("sha512", "base64", ""), ("sha1", "hex", "sha1="), ("sha256", "base64", "v1,"),
])
def test_hmac_as_configured(algorithm, encoding, prefix):
    secret, body = "s3cret", b"any bytes \x00\xff"
    digest = hmac.new(secret.encode(), body, getattr(hashlib, algorithm)).digest()
    value = prefix + (digest.hex() if encoding == "hex" else base64.b64encode(digest).decode())
    scheme = HmacScheme(header="X-Signature", algorithm=algorithm, encoding=encoding, prefix=prefix)
    verify("hmac", [secret], {"X-Signature": value}, body, hmac_scheme=scheme)
    if encoding == "hex":
        verify("hmac", [secret], {"X-Signature": prefix + digest.hex().upper()}, body, hmac_scheme=scheme)
    assert refused("hmac", ["other"], {"X-Signature": value}, body, hmac_scheme=scheme) == "signature_invalid"
    assert refused("hmac", [secret], {"X-Other": value}, body, hmac_scheme=scheme) == "signature_missing"
    if prefix:
        assert refused("hmac", [secret], {"X-Signature": value[len(prefix):]}, body, hmac_scheme=scheme) == "signature_invalid"


def test_basic_and_api_key():
    pair = "user:pa:ss"
    good = "Basic " + base64.b64encode(pair.encode()).decode()
    verify("basic", [pair], {"Authorization": good}, b"x")
    with pytest.raises(SignatureRefused) as info:
        verify("basic", [pair], {}, b"x")
    assert info.value.code == "signature_missing" and "WWW-Authenticate" in info.value.headers
    bad = "Basic " + base64.b64encode(b"user:wrong").decode()
    assert refused("basic", [pair], {"Authorization": bad}, b"x") == "signature_invalid"
    assert refused("basic", [pair], {"Authorization": "Bearer " + pair}, b"x") == "signature_invalid"

    verify("api-key", ["k-123"], {"X-API-Key": "k-123"}, b"x", api_key_header="")
    verify("api-key", ["k-123"], {"Authorization": "Bearer k-123"}, b"x", api_key_header="Authorization")
    verify("api-key", ["k-123"], {"X-Token": "k-123"}, b"x", api_key_header="X-Token")
    assert refused("api-key", ["k-123"], {"X-API-Key": "k-124"}, b"x", api_key_header="") == "signature_invalid"
    assert refused("api-key", ["k-123"], {"X-Token": "k-123"}, b"x", api_key_header="") == "signature_missing"


def test_none_accepts_anything_and_no_other_scheme_falls_back_to_it():
    verify("none", [], {}, b"x")
    for kind in ("github", "stripe", "shopify", "slack", "standard-webhooks", "basic", "api-key"):
        assert refused(kind, ["secret"], {}, b"x") == "signature_missing"
    assert refused("github", [], {"X-Hub-Signature-256": GITHUB_SIGNATURE}, GITHUB_BODY) == "signature_invalid"
