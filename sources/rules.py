"""The pure rules of a source: the verify presets and their defaults, the fields of the PUT (also
the seed's keys and the admin form's) and the specs that read a delivery id or a message type out
of a request. The API, the seed and the admin all validate through ``settings_parse`` and
``settings_check``, so a value accepted anywhere is accepted everywhere. No Django, no database."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.durations import duration_format, duration_parse
from broker.errors import InvalidInput
from broker.message_types import message_type_parse

VERIFY = ("github", "stripe", "shopify", "slack", "standard-webhooks", "hmac", "basic", "api-key", "none")
ALGORITHMS = {"sha256": hashlib.sha256, "sha512": hashlib.sha512, "sha1": hashlib.sha1}
ENCODINGS = ("hex", "base64")
# The provider's delivery id and event type, where each provider documents them.
PRESET_DEDUPE = {"github": "header:X-GitHub-Delivery", "stripe": "json:id", "shopify": "header:X-Shopify-Webhook-Id",
                 "slack": "json:event_id", "standard-webhooks": "header:webhook-id"}
PRESET_TYPE = {"github": "header:X-GitHub-Event", "stripe": "json:type", "shopify": "header:X-Shopify-Topic",
               "slack": "json:event.type", "standard-webhooks": "json:type"}
API_KEY_HEADER = "X-API-Key"  # api-key: where the key is sent unless apiKeyHeader says otherwise
WINDOW_MIN, WINDOW_MAX = 1, 30 * 86400  # dedupeWindow, seconds
SECRET_MAX = 1024
RESPONSE_BODY_MAX = 65536
NAME_MAX = 255
DELIVERY_MAX = 255  # longer delivery ids (or ones holding control characters) are shown as their hash
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,255}")  # an HTTP field name (RFC 9110 token)
JSON_PATH = re.compile(r"[^.\x00]{1,255}(\.[^.\x00]{1,255}){0,31}")
SOURCE_NAME = re.compile(r"[^/\x00-\x20\x7f]{1,255}")  # a path segment of the registry's URLs: no slash, blank or control
SOURCE_ID = re.compile(r"[A-Za-z0-9_-]{22,64}")  # token_urlsafe: at least 132 bits
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}(?:==)?|[A-Za-z0-9+/]{3}=?)?")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")
_TRUE = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}

# PUT field -> model field (the seed's keys are the PUT's)
FIELDS = {
    "verify": "verify", "secret": "secret", "signatureHeader": "signature_header", "algorithm": "algorithm",
    "encoding": "encoding", "signaturePrefix": "signature_prefix", "apiKeyHeader": "api_key_header",
    "dedupe": "dedupe", "dedupeWindow": "dedupe_window", "messageType": "message_type",
    "responseStatus": "response_status", "responseBody": "response_body",
    "responseContentType": "response_content_type", "enabled": "enabled",
}


def _verify(raw: str) -> str:
    value = raw.strip().lower()
    if value not in VERIFY:
        raise InvalidInput("invalid_verify", f"verify must be one of {', '.join(VERIFY)}")
    return value


def _text(name: str, max_length: int, pattern: re.Pattern | None = None, what: str = "") -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip()
        if len(value) > max_length or "\x00" in value or (pattern is not None and value and not pattern.fullmatch(value)):
            raise InvalidInput(f"invalid_{name}", f"{name} must be {what or f'at most {max_length} characters'}")
        return value
    return parse


def _choice(name: str, choices) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise InvalidInput(f"invalid_{name}", f"{name} must be one of {', '.join(choices)}")
        return value
    return parse


def _secret(raw: str) -> str:
    """As given (a provider's secret is compared byte for byte)."""
    value = raw
    if len(value) > SECRET_MAX or "\x00" in value:
        raise InvalidInput("invalid_secret", f"secret must be at most {SECRET_MAX} characters, no NUL")
    return value


def _window(raw: str) -> int:
    try:
        seconds = duration_parse(raw.strip())
    except ValueError:
        seconds = -1
    if not WINDOW_MIN <= seconds <= WINDOW_MAX:
        raise InvalidInput("invalid_dedupeWindow", "dedupeWindow must be a duration such as 90s, 15m, 12h, 72h, 7d "
                                                   f"(or seconds), from 1s to {duration_format(WINDOW_MAX)}")
    return seconds


def _status(raw: str) -> int:
    value = raw.strip()
    if not (value.isascii() and value.isdigit() and 200 <= int(value) <= 299):
        raise InvalidInput("invalid_responseStatus", "responseStatus must be an integer from 200 to 299")
    return int(value)


def _boolean(raw: str) -> bool:
    value = raw.strip().lower()
    if value not in _TRUE:
        raise InvalidInput("invalid_enabled", "enabled must be true or false")
    return _TRUE[value]


def _response_body(raw: str) -> str:
    """As given (blanks kept: it is what the provider reads back)."""
    if len(raw) > RESPONSE_BODY_MAX or "\x00" in raw:
        raise InvalidInput("invalid_responseBody", f"responseBody must be at most {RESPONSE_BODY_MAX} characters, no NUL")
    return raw


def _spec(name: str, kinds: tuple[str, ...]) -> Callable[[str], str | None]:
    """A ``kind:argument`` spec (``none``, ``body``: no argument); empty: back to the preset's (None)."""
    def parse(raw: str) -> str | None:
        if raw.strip() == "":
            return None
        spec_parse(raw, kinds=kinds, field=name)
        return raw
    return parse


DEDUPE_KINDS = ("header", "json", "body", "none")
TYPE_KINDS = ("header", "json", "value", "none")
_PARSERS: dict[str, Callable[[str], object]] = {
    "verify": _verify,
    "secret": _secret,
    "signatureHeader": _text("signatureHeader", 255, HEADER_NAME, "an HTTP header name"),
    "algorithm": _choice("algorithm", tuple(ALGORITHMS)),
    "encoding": _choice("encoding", ENCODINGS),
    "signaturePrefix": _text("signaturePrefix", 64, _PRINTABLE, "at most 64 printable ASCII characters"),
    "apiKeyHeader": _text("apiKeyHeader", 255, HEADER_NAME, "an HTTP header name"),
    "dedupe": _spec("dedupe", DEDUPE_KINDS),
    "dedupeWindow": _window,
    "messageType": _spec("messageType", TYPE_KINDS),
    "responseStatus": _status,
    "responseBody": _response_body,
    "responseContentType": _text("responseContentType", 255, _PRINTABLE, "at most 255 printable ASCII characters"),
    "enabled": _boolean,
}


def spec_parse(value: str, *, kinds: tuple[str, ...], field: str) -> tuple[str, str]:
    """``header:NAME``, ``json:dotted.path``, ``value:TYPE``, ``body`` or ``none`` -> (kind,
    argument); 400 ``invalid_<field>`` for anything else."""
    kind, _, argument = value.partition(":")  # as written: a JSON key may hold blanks
    kind = kind.lower()
    ok = kind in kinds and (
        (kind in ("body", "none") and argument == "")
        or (kind == "header" and HEADER_NAME.fullmatch(argument) is not None)
        or (kind == "json" and JSON_PATH.fullmatch(argument) is not None)
        or (kind == "value" and _type_ok(argument)))
    if not ok:
        forms = {"header": "header:NAME", "json": "json:dotted.path", "value": "value:TYPE", "body": "body",
                 "none": "none"}
        raise InvalidInput(f"invalid_{field}", f"{field} must be {', '.join(forms[k] for k in kinds)}")
    return kind, argument


def _type_ok(value: str) -> bool:
    try:
        return message_type_parse(value) is not None
    except InvalidInput:
        return False


def settings_parse(raw: Mapping[str, str | None]) -> dict:
    """The fields given (PUT names -> text; None or absent: not given), validated, as model fields.
    An empty ``dedupe`` or ``messageType`` is None (the preset's default)."""
    fields: dict = {}
    for name, value in raw.items():
        if value is None or name not in _PARSERS:
            continue
        if not isinstance(value, str):
            raise InvalidInput(f"invalid_{name}", f"{name} must be a string")
        if name == "secret" and value == "":
            continue  # empty: unchanged (as a token)
        fields[FIELDS[name]] = _PARSERS[name](value)
    return fields


@dataclass(frozen=True)
class SourceState:
    """What a source will be once a PUT applies (its stored values overlaid with the new ones)."""

    verify: str
    secret: str
    signature_header: str
    api_key_header: str


def settings_check(*, new: SourceState, old: SourceState | None, fields: dict) -> None:
    """The rules across fields: ``verify`` on creation; a secret unless ``verify`` is none (a new
    one when ``verify`` changes), in the form the preset takes; ``signatureHeader`` for hmac."""
    if old is None and "verify" not in fields:
        raise InvalidInput("verify_required", "verify is required: " + ", ".join(VERIFY))
    if new.verify == "none":
        return
    changed = old is not None and old.verify != new.verify
    if "secret" not in fields and (old is None or changed or not new.secret):
        raise InvalidInput("secret_required", f"a secret is required with verify {new.verify}"
                                              + (" (verify changed)" if changed else ""))
    secret_check(new.verify, new.secret)
    if new.verify == "hmac" and not new.signature_header:
        raise InvalidInput("signature_header_required", "signatureHeader is required with verify hmac")


def secret_check(verify: str, secret: str) -> None:
    """400 ``invalid_secret`` when ``secret`` is not in the form ``verify`` takes."""
    if not secret:
        raise InvalidInput("secret_required", f"a secret is required with verify {verify}")
    if verify == "standard-webhooks":
        body = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
        if not body or not _BASE64.fullmatch(body) or not standard_key(secret):
            raise InvalidInput("invalid_secret", "a standard-webhooks secret is whsec_ followed by base64")
    elif verify == "basic":
        user, colon, password = secret.partition(":")
        if not colon or not user or not password:
            raise InvalidInput("invalid_secret", "a basic secret is user:password")


def standard_key(secret: str) -> bytes:
    """The key of a Standard Webhooks secret (``whsec_`` + base64, padding optional)."""
    body = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
    try:
        return base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        return b""


def dedupe_spec(source_dedupe: str | None, verify: str) -> str:
    """The spec in force: the source's, else its preset's (``none`` for the others)."""
    return source_dedupe if source_dedupe is not None else PRESET_DEDUPE.get(verify, "none")


def type_spec(source_type: str | None, verify: str) -> str:
    return source_type if source_type is not None else PRESET_TYPE.get(verify, "none")


# --- reading a request ------------------------------------------------------------------------------

class Body:
    """A request body, parsed as JSON at most once and only if a spec asks."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._json: object = None
        self._parsed = False

    def json(self) -> object:
        if not self._parsed:
            self._parsed = True
            try:
                self._json = json.loads(self.raw)
            except (ValueError, UnicodeDecodeError, RecursionError):
                self._json = None
        return self._json


def json_path(document: object, path: str) -> object:
    """The value at ``dotted.path`` (object keys; a list takes an index), or None."""
    node = document
    for part in path.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isascii() and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def spec_read(spec: tuple[str, str], headers: Mapping[str, str], body: Body) -> str | None:
    """The text a spec names in a request (None when absent or not a scalar)."""
    kind, argument = spec
    if kind == "header":
        value = headers.get(argument.lower())
        return value.strip() or None if value is not None else None
    if kind == "json":
        value = json_path(body.json(), argument)
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, (str, int, float)):
            return str(value) or None
        return None
    if kind == "body":
        return "sha256:" + hashlib.sha256(body.raw).hexdigest()
    if kind == "value":
        return argument
    return None


def delivery_shown(key: str) -> str:
    """A delivery id as consumers see it (a header value): as given when it is short printable
    text, else ``sha256:`` and its hash (it is deduplicated on its full text either way)."""
    if len(key) <= DELIVERY_MAX and _PRINTABLE.fullmatch(key):
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
