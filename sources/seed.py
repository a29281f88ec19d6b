"""Sources in the seed file and in ``broker_export``: one section per source,

    [source:<channel>/<name>]
    verify=github                 (required: github, stripe, shopify, slack, standard-webhooks, hmac,
                                   basic, api-key, none)
    secret=...                    (required unless verify=none; broker_export writes it only with
                                   --with-secrets)
    id=...                        (optional: the URL id to keep, /in/<id>; a new source without one
                                   gets a random one; broker_export writes it only with --with-secrets)
    signatureHeader=, algorithm=, encoding=, signaturePrefix=, apiKeyHeader=, dedupe=,
    dedupeWindow=, messageType=, responseStatus=, responseBody=, responseContentType=, enabled=
                                  (as the PUT takes them; a key left out keeps the value; a
                                   responseBody written as a JSON string, "...", is decoded: how
                                   broker_export writes one with line breaks)

The keys are the PUT's and are validated by the same rules (``sources.rules``); a section with a
bad value, or naming a channel that neither the file nor the database has, is skipped with a
logged error. Registered with ``consumers.seed`` by ``sources.apps``.
"""

from __future__ import annotations

import json
import logging

from broker.durations import duration_format
from broker.errors import DomainError
from broker.models import Channel
from consumers.seed import SeedSection
from sources.models import DEDUPE_WINDOW_DEFAULT, Source
from sources.registry import source_upsert
from sources.rules import FIELDS, settings_parse

logger = logging.getLogger("broker.services.seed")  # the seed's own logger: what operators filter on
PREFIX = "source:"
_SECRET_KEYS = ("secret", "id")


def sources_seed_parse(ini, errors: list) -> dict:
    """{"<channel>/<name>": {"channel", "name", "id", "fields"}} of the file's source sections."""
    found = {}
    for section in ini.sections():
        if not section.startswith(PREFIX):
            continue
        channel, slash, name = section[len(PREFIX):].strip().partition("/")
        if not slash or not channel or not name:
            errors.append(f"[{section}]: a source section is [source:<channel>/<name>], skipped")
            continue
        options = dict(ini.items(section))
        unknown = sorted(set(options) - set(FIELDS) - {"id"})
        if unknown:
            errors.append(f"source {channel}/{name}: unknown keys {', '.join(unknown)}, skipped")
            continue
        if options.get("responseBody", "").startswith('"'):
            options["responseBody"] = _body_read(options["responseBody"])
        try:
            fields = settings_parse({key: value for key, value in options.items() if key in FIELDS})
        except DomainError as exc:
            errors.append(f"source {channel}/{name}: {exc.detail}, skipped")
            continue
        found[f"{channel}/{name}"] = {"channel": channel, "name": name, "id": options.get("id", "").strip() or None,
                                      "fields": fields}
    return found


def _body_written(body: str) -> str:
    """A responseBody as one INI value: as it is, or as a JSON string when INI would not keep it
    (a line break, a blank at either end, a leading quote)."""
    if "\n" in body or "\r" in body or body != body.strip() or body.startswith('"'):
        return json.dumps(body)
    return body


def _body_read(value: str) -> str:
    try:
        text = json.loads(value)
    except ValueError:
        return value
    return text if isinstance(text, str) else value


def sources_seed_apply(items: dict) -> int:
    """Create or update each source (in the seed's transaction); returns how many were created."""
    created = 0
    for key, item in items.items():
        channel = Channel.objects.filter(channel_id=item["channel"]).first()
        if channel is None:
            logger.error("seed: source %s skipped: channel %r does not exist", key, item["channel"])
            continue
        try:
            _, new = source_upsert(channel=channel, name=item["name"], fields=dict(item["fields"]),
                                   source_id=item["id"])
        except DomainError as exc:
            logger.error("seed: source %s skipped: %s", key, exc.detail)
            continue
        created += new
    return created


def sources_seed_public(items: dict) -> dict:
    """The sources of a plan without their secrets and ids (/_status)."""
    return {key: {"channel": item["channel"], "name": item["name"],
                  "fields": {f: v for f, v in item["fields"].items() if f != "secret"}}
            for key, item in items.items()}


def sources_export(with_secrets: bool) -> list[tuple[str, list[tuple[str, str]]]]:
    """Every source as a seed section, every setting written (a dedupe or type left to the preset
    is written empty, which the seed reads back as "the preset's")."""
    sections = []
    for s in Source.objects.select_related("channel").order_by("channel__channel_id", "name"):
        items = [("verify", s.verify), ("secret", s.secret if with_secrets else ""),
                 ("id", s.source_id if with_secrets else ""), ("dedupe", s.dedupe or ""),
                 ("dedupeWindow", duration_format(s.dedupe_window or DEDUPE_WINDOW_DEFAULT)),
                 ("messageType", s.message_type or ""), ("responseStatus", str(s.response_status)),
                 ("enabled", str(s.enabled).lower())]
        if s.verify == "hmac":
            items += [("signatureHeader", s.signature_header), ("algorithm", s.algorithm),
                      ("encoding", s.encoding), ("signaturePrefix", s.signature_prefix)]
        if s.verify == "api-key" and s.api_key_header:
            items.append(("apiKeyHeader", s.api_key_header))
        if s.response_body:
            items.append(("responseBody", _body_written(s.response_body)))
        if s.response_content_type:
            items.append(("responseContentType", s.response_content_type))
        sections.append((f"{PREFIX}{s.channel.channel_id}/{s.name}", items))
    return sections


SEED_SECTION = SeedSection(key="sources", parse=sources_seed_parse, apply=sources_seed_apply,
                           public=sources_seed_public, export=sources_export)
