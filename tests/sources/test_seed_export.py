"""Sources in the seed file and in ``broker_export``: a registry with sources exported, emptied, seeded
back and exported again is the same, URL ids and secrets included (with --with-secrets); a seed's
bad source section is skipped with its reason; without --with-secrets neither secret nor id is
written."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from broker.models import Channel, Producer
from consumers.models import Consumer
from consumers.seed import seed_apply, seed_parse
from sources.models import Source
from tests.helpers import seed_one_channel

pytestmark = pytest.mark.django_db


def _export(*args) -> str:
    out = io.StringIO()
    call_command("broker_export", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_export_seed_export_round_trip(sources, tmp_path):
    sources.make("gh", responseStatus=202, responseBody='{"ok":\n true}', responseContentType="application/json")
    sources.make("st", verify="stripe", secret="whsec_abc", dedupe="none", dedupeWindow="30m")
    sources.make("mac", verify="hmac", secret="k", signatureHeader="X-Sig", algorithm="sha512", encoding="base64",
                 signaturePrefix="v1=", messageType="json:kind")
    sources.make("key", verify="api-key", secret="key-1", apiKeyHeader="X-Token", enabled=False)
    sources.make("open", verify="none")
    ids = dict(Source.objects.values_list("name", "source_id"))
    first = _export("--with-secrets")
    assert "[source:ch1/gh]" in first and ids["gh"] in first and "whsec_abc" in first
    public = _export()
    assert ids["gh"] not in public and "whsec_abc" not in public and "[source:ch1/st]" in public

    path = tmp_path / "registry.ini"
    path.write_text(first)
    Source.objects.all().delete()
    Consumer.objects.all().delete()
    Channel.objects.all().delete()
    Producer.objects.all().delete()
    call_command("seed", config=str(path), stdout=io.StringIO(), stderr=io.StringIO())
    assert dict(Source.objects.values_list("name", "source_id")) == ids
    assert _export("--with-secrets") == first
    assert Source.objects.get(name="gh").response_body == '{"ok":\n true}'
    body = b"{}"
    from tests.sources.conftest import github_headers
    assert sources.post(ids["gh"], body, github_headers(body)).status_code == 202  # the same address works


def test_a_seed_file_with_sources(db):
    text = seed_one_channel("") + """
[source:ch/github]
verify=github
secret=s3cret
dedupeWindow=24h

[source:ch/broken]
verify=github
dedupeWindow=90d

[source:nochannel/x]
verify=none

[source:missing-slash]
verify=none

[source:ch/odd]
verify=none
colour=blue
"""
    plan = seed_parse(text)
    assert set(plan.sections["sources"]) == {"ch/github", "nochannel/x"}
    assert any("ch/broken" in e and "dedupeWindow" in e for e in plan.errors)
    assert any("missing-slash" in e for e in plan.errors) and any("colour" in e for e in plan.errors)
    assert "secret" not in str(plan.public()) and "s3cret" not in str(plan.public())
    created = seed_apply(plan)
    assert created["sources"] == 1
    source = Source.objects.get(name="github")
    assert source.dedupe_window == 86400 and source.secret == "s3cret" and len(source.source_id) == 32
    again = seed_apply(seed_parse(text.replace("24h", "12h")))
    assert again["sources"] == 0 and Source.objects.get(name="github").dedupe_window == 43200
    assert Source.objects.get(name="github").source_id == source.source_id
