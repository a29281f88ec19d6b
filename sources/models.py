"""Sources, their dedupe rows and their last refusals."""

from __future__ import annotations

from django.db import models

from broker.models import Channel

DEDUPE_WINDOW_DEFAULT = 72 * 3600  # seconds


class Source(models.Model):
    """Where a provider's webhooks come in: ``/in/{source_id}`` publishes to ``channel``.

    ``dedupe`` and ``message_type`` hold a spec (``header:NAME``, ``json:path``, ...); null means
    the verify preset's default (``sources.rules``), so a source follows its preset. The secret is
    never shown after the answer that set it; ``previous_secret`` still verifies until
    ``previous_expires_at`` (BROKER_SECRET_ROTATION_GRACE after a change)."""

    channel = models.ForeignKey(Channel, on_delete=models.PROTECT, related_name="sources")
    name = models.CharField(max_length=255)
    source_id = models.CharField(max_length=64, unique=True)  # random, >= 128 bits: the URL's id
    verify = models.CharField(max_length=32)
    secret = models.TextField(blank=True, default="")
    previous_secret = models.TextField(blank=True, default="")
    previous_expires_at = models.DateTimeField(null=True, blank=True)
    signature_header = models.CharField(max_length=255, blank=True, default="")  # hmac
    algorithm = models.CharField(max_length=8, default="sha256")  # hmac: sha256, sha512, sha1
    encoding = models.CharField(max_length=8, default="hex")  # hmac: hex, base64
    signature_prefix = models.CharField(max_length=64, blank=True, default="")  # hmac, e.g. "sha256="
    api_key_header = models.CharField(max_length=255, blank=True, default="")  # api-key
    dedupe = models.CharField(max_length=300, null=True, blank=True)
    dedupe_window = models.PositiveIntegerField(default=DEDUPE_WINDOW_DEFAULT)  # seconds
    message_type = models.CharField(max_length=300, null=True, blank=True)
    response_status = models.PositiveSmallIntegerField(default=200)
    response_body = models.TextField(blank=True, default="")
    response_content_type = models.CharField(max_length=255, blank=True, default="")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField()  # the optimistic-concurrency version, as the registry's

    class Meta:
        constraints = [models.UniqueConstraint(fields=["channel", "name"], name="source_unique_per_channel")]
        indexes = [models.Index(fields=["-created_at", "-id"], name="source_list")]

    def __str__(self) -> str:
        return self.name


class SourceDelivery(models.Model):
    """A delivery id a source took within its dedupe window: written by the ``sources_message_check``
    trigger in the statement that stores the message (a redelivery inserts nothing, so publishes
    nothing), deleted once expired by the housekeeping step ``sources.prune``. ``key``: the first
    16 bytes of the SHA-256 of the delivery id. No foreign key: a source's rows expire after it."""

    pk = models.CompositePrimaryKey("source_id", "key")
    source_id = models.BigIntegerField()
    key = models.BinaryField(max_length=16)
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["expires_at"], name="source_delivery_expiry")]


class SourceRefusal(models.Model):
    """One of a source's last refused requests (the newest ``REFUSALS_KEPT`` are kept)."""

    source = models.ForeignKey(Source, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False,
                               related_name="+")  # served by source_refusal_recent
    at = models.DateTimeField()
    reason = models.CharField(max_length=64)
    detail = models.CharField(max_length=255, blank=True, default="")
    remote = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["source", "-id"], name="source_refusal_recent")]
