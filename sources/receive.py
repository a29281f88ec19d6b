"""One request to a source's address: verify, deduplicate, publish, answer.

``source_request_receive`` takes plain values (the id, the headers by lower-case name, the raw
body), never a Django request, so any HTTP front end can serve ``POST /in/{id}`` through it (the
Django view in ``web.api.sources`` is a thin adapter). It returns the answer for the provider
(``SourceAnswer``) or raises a domain error (the web layer maps it: 404 unknown id, 401
signature_missing / signature_invalid / timestamp_out_of_tolerance, 403 source_disabled, 413,
and the publish's own refusals: 422 when the event breaks the channel's event types, 429
backlog_full, 503 database_unavailable).

A verified request becomes one message of the source's channel: the body byte for byte, its
Content-Type, the type the source's ``messageType`` reads, the headers ``X-Broker-Source`` (the
source's name) and ``X-Broker-Source-Delivery`` (the delivery id its ``dedupe`` reads), the
request's trace context. It goes through the group-commit publish (``message_publish_grouped``:
the requests that arrive together share a commit) and the answer is returned only once the
message is committed. The dedupe is in the database, in the message's own statement (the
``sources_message_check`` trigger, migration 0002): a delivery id seen within the window stores
nothing and answers as an accepted request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction

from broker.db.errors import DB_ERRORS, database_unavailable, sqlstate_of
from broker.errors import DomainError, Forbidden, InvalidInput, NotFound, TooLarge, Unavailable
from broker.message_types import message_type_parse
from broker.tracing import trace_context_parse
from eventtypes.validation import channel_rules_held, message_validate
from jobs.publish.grouped import message_publish_grouped
from jobs.publish.messages import NewMessage
from sources.lookup import SOURCES_PRODUCER, SourceSnapshot, source_lookup
from sources.rules import SOURCE_ID, Body, delivery_shown, spec_read
from sources.tallies import ACCEPTED, CHALLENGE, DUPLICATE, source_request_count
from sources.verify import HmacScheme, SignatureRefused, request_verify

SOURCE_HEADER = "X-Broker-Source"
DELIVERY_HEADER = "X-Broker-Source-Delivery"
SOURCE_REF = "broker:source"  # the trigger's key (no HTTP header name holds a colon); removed before storing
SOURCE_GONE_SQLSTATE = "BRK36"  # the trigger: the source was deleted or disabled
REREAD_AFTER = 0.1  # seconds: a refused signature reads a source this old again (a secret just rotated)
CONTENT_TYPE_MAX = 255


@dataclass(frozen=True)
class SourceAnswer:
    """What the provider gets back."""

    status: int
    content_type: str | None
    body: bytes
    headers: dict = field(default_factory=dict)


def source_request_receive(*, source_id: str, headers: Mapping[str, str], body: bytes,
                           remote: str = "") -> SourceAnswer:
    """Receive one request to ``/in/{source_id}`` (``headers`` by lower-case name). Returns the
    answer once the message is committed (or known to be a redelivery); raises a DomainError for
    a refusal, counted in the source's tally with its reason (``remote``: the client's address,
    kept with the last refusals)."""
    source = None
    try:
        source = source_lookup(source_id=source_id) if SOURCE_ID.fullmatch(source_id or "") else None
        if source is None:
            raise NotFound("source_not_found", "no source has this address")
        try:
            answer, outcome = _receive(source, headers, body)
        except DomainError as exc:
            source_request_count(source_pk=source.pk, outcome=exc.code, detail=exc.detail, remote=remote)
            raise
    except DB_ERRORS as exc:  # a database that cannot serve now: 503 with Retry-After (the provider retries)
        if not database_unavailable(exc):
            raise  # any other database error is a bug
        if source is not None:
            source_request_count(source_pk=source.pk, outcome="database_unavailable", remote=remote)
        raise Unavailable("database_unavailable", "the database is unavailable, retry shortly",
                          retry_after=1) from exc
    source_request_count(source_pk=source.pk, outcome=outcome)
    return answer


def source_request_too_large(*, source_id: str, remote: str = "") -> TooLarge:
    """The refusal of a body over BROKER_MAX_PAYLOAD_BYTES that a front end saw coming from its
    Content-Length (before reading it), counted like the others; unknown id: 404."""
    source = source_lookup(source_id=source_id) if SOURCE_ID.fullmatch(source_id or "") else None
    if source is None:
        return NotFound("source_not_found", "no source has this address")
    refusal = _too_large()
    source_request_count(source_pk=source.pk, outcome=refusal.code, detail=refusal.detail, remote=remote)
    return refusal


def source_request_admit(*, source_id: str, remote: str = "") -> None:
    """What a front end checks before reading a large body (the provider's signature, the credential,
    needs the body): 404 for an unknown id, 403 ``source_disabled`` (counted) for a disabled source."""
    source = source_lookup(source_id=source_id) if SOURCE_ID.fullmatch(source_id or "") else None
    if source is None:
        raise NotFound("source_not_found", "no source has this address")
    if not source.enabled:
        refusal = Forbidden("source_disabled", "this source is disabled")
        source_request_count(source_pk=source.pk, outcome=refusal.code, detail=refusal.detail, remote=remote)
        raise refusal


def _too_large() -> TooLarge:
    return TooLarge("payload_too_large", f"body is larger than {settings.BROKER_MAX_PAYLOAD_BYTES} bytes")


@dataclass(frozen=True)
class Received:
    """A verified request, ready to publish: its ``message`` (None: answered without one, Slack's URL
    check) and the ``answer`` the provider gets once it is stored (or known to be a redelivery)."""

    source: SourceSnapshot  # the one it verified against (read again if a secret just rotated)
    message: NewMessage | None
    answer: SourceAnswer
    outcome: str = ACCEPTED  # (a request answered without a message: its tally's outcome)


class WouldBlock(Exception):
    """(``source_request_prepare(blocking=False)``) What is left needs a query: the caller leaves
    the request to ``source_request_receive``."""


def source_request_prepare(*, source: SourceSnapshot, headers: Mapping[str, str], body: bytes,
                           blocking: bool = True) -> Received:
    """Everything before the publish, without writing anything: the checks, the signature, the
    message (its type, its delivery id), the channel's event types. Raises the refusal's DomainError
    (not counted: the caller counts). ``blocking=False`` (a caller that must not wait for the
    database, such as the web server's event loop): never queries; a refused signature is refused
    as the source is held (never read again) and channel event types not held current raise
    ``WouldBlock``; the caller leaves those to ``source_request_receive``."""
    if not source.enabled:
        raise Forbidden("source_disabled", "this source is disabled")
    if len(body) > settings.BROKER_MAX_PAYLOAD_BYTES:
        raise _too_large()
    if blocking:
        source = _verified(source, headers, body)
    else:
        _verify(source, headers, body)
    parsed = Body(body)
    if source.verify == "slack":  # Slack's URL check when the address is set: echo, publish nothing
        document = parsed.json()
        if isinstance(document, dict) and document.get("type") == "url_verification":
            challenge = document.get("challenge")
            return Received(source, None, SourceAnswer(200, "application/json",
                                                       json.dumps({"challenge": challenge}).encode()), CHALLENGE)
    content_type = (headers.get("content-type") or "").strip() or "application/octet-stream"
    if len(content_type) > CONTENT_TYPE_MAX:
        raise InvalidInput("invalid_content_type", f"Content-Type is longer than {CONTENT_TYPE_MAX} characters")
    message_type = spec_read(source.message_type, headers, parsed)
    try:
        message_type = message_type_parse(message_type, field=f"the message type ({':'.join(source.message_type)})")
    except InvalidInput as exc:
        raise InvalidInput("invalid_message_type", exc.detail) from None
    message_headers = {SOURCE_HEADER: source.name, SOURCE_REF: str(source.pk)}
    delivery = spec_read(source.dedupe, headers, parsed)
    if delivery is not None:
        message_headers[DELIVERY_HEADER] = delivery_shown(delivery)
    message = NewMessage(payload=body, content_type=content_type, type=message_type, headers=message_headers,
                         trace=trace_context_parse(headers.get("traceparent"), headers.get("tracestate")))
    # held to the channel's event types, as every publish is (422 schema_validation_failed / unknown_event_type)
    rules = None if blocking else channel_rules_held(source.channel_id)
    if rules is None and not blocking:
        raise WouldBlock("the channel's event types are not held current")
    message_validate(channel_id=source.channel_id, message_type=message.type, payload=message.payload,
                     content_type=message.content_type, rules=rules)
    content = source.response_body.encode()
    return Received(source, message, SourceAnswer(
        source.response_status, (source.response_content_type or "text/plain; charset=utf-8") if content else None,
        content))


def _receive(source: SourceSnapshot, headers: Mapping[str, str], raw: bytes) -> tuple[SourceAnswer, str]:
    received = source_request_prepare(source=source, headers=headers, body=raw)
    if received.message is None:
        return received.answer, received.outcome
    fresh = _publish(received.source, received.message)
    return received.answer, ACCEPTED if fresh else DUPLICATE


def _verified(source: SourceSnapshot, headers: Mapping[str, str], body: bytes) -> SourceSnapshot:
    """The source the request verifies against: as cached, or read again when the cached one is
    more than REREAD_AFTER old and refuses it (a secret rotated in another process a moment ago)."""
    try:
        _verify(source, headers, body)
        return source
    except SignatureRefused:
        if time.monotonic() - source.read_at < REREAD_AFTER:
            raise
        again = source_lookup(source_id=source.source_id, fresh=True)
        if again is None:
            raise NotFound("source_not_found", "no source has this address") from None
        if not again.enabled:
            raise Forbidden("source_disabled", "this source is disabled") from None
        _verify(again, headers, body)
        return again


def _verify(source: SourceSnapshot, headers: Mapping[str, str], body: bytes) -> None:
    now = time.time()
    request_verify(verify=source.verify, secrets=source.secrets(now), headers=headers, body=body, now=now,
                   hmac_scheme=HmacScheme(header=source.signature_header, algorithm=source.algorithm,
                                          encoding=source.encoding, prefix=source.signature_prefix),
                   api_key_header=source.api_key_header)


def _publish(source: SourceSnapshot, message: NewMessage) -> bool:
    """Publish through the group commit; True when stored, False for a redelivery (the trigger
    skipped it). A cached token that no longer matches (a channel token changed) is read again
    once; a source deleted or disabled since it was cached answers 404 / 403."""
    for attempt in (1, 2):
        try:
            # inside a caller's transaction (tests) a refusal of the trigger must not abort it
            with transaction.atomic() if connection.in_atomic_block else nullcontext():
                message_publish_grouped(channel_id=source.channel_id, channel_token=source.channel_token,
                                        producer_id=SOURCES_PRODUCER, producer_token=source.producer_token,
                                        message=message)
            return True
        except DomainError as exc:
            if exc.code == "duplicate_message_id":
                return False
            if exc.code not in ("channel_token_mismatch", "producer_not_found", "producer_token_mismatch",
                                "channel_not_found") or attempt == 2:
                raise
        except DB_ERRORS as exc:
            if database_unavailable(exc) or sqlstate_of(exc) != SOURCE_GONE_SQLSTATE:
                raise
        again = source_lookup(source_id=source.source_id, fresh=True)
        if again is None:
            raise NotFound("source_not_found", "no source has this address")
        if not again.enabled:
            raise Forbidden("source_disabled", "this source is disabled")
        if again.pk != source.pk:
            raise NotFound("source_not_found", "no source has this address")
        source = again
    raise NotFound("source_not_found", "no source has this address")
