"""Signature verification, as each provider documents it, with constant-time comparison. Pure:
the request's headers (lower-case names), its raw body, the secrets that may sign it (the current
one, and the previous one during its grace) and the clock.

A source verifies exactly as configured: there is no fallback to another scheme or to none. A
refusal is ``SignatureRefused`` (401) with the code ``signature_missing``, ``signature_invalid`` or
``timestamp_out_of_tolerance``. Standard Webhooks goes through the ``standardwebhooks`` package;
the others are one HMAC each (``hmac.compare_digest``), checked against the providers' own
examples and libraries (tests/sources/unit/test_verify.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from broker.errors import Unauthenticated
from sources.rules import ALGORITHMS, API_KEY_HEADER, standard_key

TOLERANCE = 300  # seconds: Stripe's, Slack's and Standard Webhooks' documented tolerance


class SignatureRefused(Unauthenticated):
    """The request does not prove it comes from the source's sender (401)."""


def _missing(what: str, **headers) -> SignatureRefused:
    return SignatureRefused("signature_missing", f"{what} is missing", headers=headers)


def _invalid(what: str = "the signature does not match", **headers) -> SignatureRefused:
    return SignatureRefused("signature_invalid", what, headers=headers)


def _stale(timestamp) -> SignatureRefused:
    return SignatureRefused("timestamp_out_of_tolerance",
                            f"the signed timestamp {str(timestamp)[:20]} is more than {TOLERANCE} s from now")


def _equal(a: str | bytes, b: str | bytes) -> bool:
    a = a.encode("utf-8", "surrogateescape") if isinstance(a, str) else a
    b = b.encode("utf-8", "surrogateescape") if isinstance(b, str) else b
    return hmac.compare_digest(a, b)


def _mac(secret: str | bytes, data: bytes, algorithm: str = "sha256") -> bytes:
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    return hmac.new(key, data, ALGORITHMS[algorithm]).digest()


@dataclass(frozen=True)
class HmacScheme:
    """verify ``hmac``: the signature of the raw body in ``header``, ``prefix`` + encoded digest."""

    header: str
    algorithm: str = "sha256"
    encoding: str = "hex"
    prefix: str = ""


def github(secrets: Sequence[str], headers: Mapping[str, str], body: bytes, now: float) -> None:
    """``X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>``."""
    given = headers.get("x-hub-signature-256")
    if not given:
        raise _missing("X-Hub-Signature-256")
    given = given.strip()
    if not given.startswith("sha256="):
        raise _invalid("X-Hub-Signature-256 must be sha256=<hex>")
    if not any(_equal("sha256=" + _mac(s, body).hex(), "sha256=" + given[7:].lower()) for s in secrets):
        raise _invalid()


def stripe(secrets: Sequence[str], headers: Mapping[str, str], body: bytes, now: float) -> None:
    """``Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`` (any of several
    v1), as ``stripe.WebhookSignature.verify_header`` checks it: the signature first, then a
    timestamp older than the tolerance."""
    header = headers.get("stripe-signature")
    if not header:
        raise _missing("Stripe-Signature")
    timestamp, signatures = None, []
    for item in header.split(","):  # parsed as the library does: no blanks, the first t
        key, _, value = item.partition("=")
        value = value.split("=")[0]
        if key == "t" and timestamp is None:
            timestamp = value
        elif key == "v1":
            signatures.append(value)
    try:
        stamp = int(timestamp)
    except (TypeError, ValueError):
        raise _invalid("Stripe-Signature has no t=<unix time>") from None
    if not signatures:
        raise _invalid("Stripe-Signature has no v1 signature")
    signed = f"{stamp}.".encode() + body
    if not any(_equal(_mac(s, signed).hex(), given) for s in secrets for given in signatures):
        raise _invalid()
    if stamp < now - TOLERANCE:
        raise _stale(stamp)


def shopify(secrets: Sequence[str], headers: Mapping[str, str], body: bytes, now: float) -> None:
    """``X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256(secret, body)>``."""
    given = headers.get("x-shopify-hmac-sha256")
    if not given:
        raise _missing("X-Shopify-Hmac-Sha256")
    try:
        digest = base64.b64decode(given.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise _invalid("X-Shopify-Hmac-Sha256 is not base64") from None
    if not any(_equal(_mac(s, body), digest) for s in secrets):
        raise _invalid()


def slack(secrets: Sequence[str], headers: Mapping[str, str], body: bytes, now: float) -> None:
    """``X-Slack-Signature: v0=<hex HMAC-SHA256(secret, "v0:<X-Slack-Request-Timestamp>:<body>")>``,
    the timestamp within the tolerance either way (Slack's documented order: timestamp, then signature)."""
    given = headers.get("x-slack-signature")
    timestamp = headers.get("x-slack-request-timestamp")
    if not given or not timestamp:
        raise _missing("X-Slack-Signature" if not given else "X-Slack-Request-Timestamp")
    try:
        stamp = int(timestamp.strip())
    except ValueError:
        raise _invalid("X-Slack-Request-Timestamp is not a Unix time") from None
    if abs(now - stamp) > TOLERANCE:
        raise _stale(stamp)
    signed = f"v0:{stamp}:".encode() + body
    if not any(_equal("v0=" + _mac(s, signed).hex(), given.strip()) for s in secrets):
        raise _invalid()


def standard_webhooks(secrets: Sequence[str], headers: Mapping[str, str], body: bytes, now: float) -> None:
    """``webhook-id``, ``webhook-timestamp``, ``webhook-signature`` (Standard Webhooks): the
    ``standardwebhooks`` package's ``Webhook.verify`` (its own clock and 5-minute tolerance)."""
    names = ("webhook-id", "webhook-timestamp", "webhook-signature")
    absent = [name for name in names if not headers.get(name)]
    if absent:
        raise _missing(", ".join(absent))
    given = {name: headers[name] for name in names}
    stale = None
    for secret in secrets:
        try:
            Webhook(standard_key(secret)).verify(body, given, json_parse=False)
            return
        except WebhookVerificationError as exc:
            if "timestamp" in str(exc).lower() and "too" in str(exc).lower():
                stale = exc
        except (ValueError, binascii.Error, UnicodeDecodeError):  # a malformed signature list, a body not UTF-8
            continue
    if stale is not None:
        raise _stale(given["webhook-timestamp"])
    raise _invalid()


def hmac_body(secrets: Sequence[str], headers: Mapping[str, str], body: bytes, scheme: HmacScheme) -> None:
    """verify ``hmac``: ``<header>: <prefix><hex or base64 HMAC(secret, body)>``."""
    given = headers.get(scheme.header.lower())
    if not given:
        raise _missing(scheme.header)
    given = given.strip()
    if not given.startswith(scheme.prefix):
        raise _invalid(f"{scheme.header} must start with {scheme.prefix!r}")
    given = given[len(scheme.prefix):]
    if scheme.encoding == "hex":
        ok = any(_equal(_mac(s, body, scheme.algorithm).hex(), given.lower()) for s in secrets)
    else:
        try:
            digest = base64.b64decode(given, validate=True)
        except (binascii.Error, ValueError):
            raise _invalid(f"{scheme.header} is not base64") from None
        ok = any(_equal(_mac(s, body, scheme.algorithm), digest) for s in secrets)
    if not ok:
        raise _invalid()


def basic(secrets: Sequence[str], headers: Mapping[str, str]) -> None:
    """``Authorization: Basic base64(user:password)``, the whole pair compared."""
    challenge = {"WWW-Authenticate": 'Basic realm="broker source", charset="UTF-8"'}
    given = headers.get("authorization")
    if not given:
        raise _missing("Authorization", **challenge)
    scheme, _, encoded = given.strip().partition(" ")
    if scheme.lower() != "basic":
        raise _invalid("Authorization must be Basic", **challenge)
    try:
        pair = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise _invalid("Authorization is not base64", **challenge) from None
    if not any(_equal(s, pair) for s in secrets):
        raise _invalid("the user or password does not match", **challenge)


def api_key(secrets: Sequence[str], headers: Mapping[str, str], header: str) -> None:
    """The key in ``header`` (``Authorization`` may say ``Bearer <key>``)."""
    name = header or API_KEY_HEADER
    given = headers.get(name.lower())
    if not given:
        raise _missing(name)
    given = given.strip()
    if name.lower() == "authorization" and given[:7].lower() == "bearer ":
        given = given[7:].strip()
    if not any(_equal(s, given) for s in secrets):
        raise _invalid("the key does not match")


_TIMED = {"github": github, "stripe": stripe, "shopify": shopify, "slack": slack,
          "standard-webhooks": standard_webhooks}


def request_verify(*, verify: str, secrets: Sequence[str], headers: Mapping[str, str], body: bytes, now: float,
                   hmac_scheme: HmacScheme | None = None, api_key_header: str = "") -> None:
    """Verify one request as ``verify`` says; raises ``SignatureRefused``. ``none`` accepts all."""
    if verify == "none":
        return
    if not secrets:  # a source is never stored without one (sources.rules.settings_check)
        raise _invalid("the source has no secret")
    if verify in _TIMED:
        _TIMED[verify](secrets, headers, body, now)
    elif verify == "hmac":
        hmac_body(secrets, headers, body, hmac_scheme or HmacScheme(header=""))
    elif verify == "basic":
        basic(secrets, headers)
    elif verify == "api-key":
        api_key(secrets, headers, api_key_header)
    else:
        raise _invalid(f"unknown verify {verify!r}")
