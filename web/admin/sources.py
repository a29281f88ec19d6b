"""Admin for inbound sources: create, edit, disable and enable, rotate the secret, delete; with each
source's address, its counts by outcome and its last refusals. Listed by channel (the channel page
lists its sources too).

Saves, rotations and deletes go through ``sources.registry`` (the services behind the API), with
the form's load time as If-Unmodified-Since. A secret is never shown again once set: a new or
rotated one is shown once, on the page the save or the rotation returns.
"""

from __future__ import annotations

import logging

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.http import http_date

from broker.durations import duration_format
from broker.errors import DomainError, PreconditionFailed
from broker.registry import Precondition
from sources.models import Source
from sources.registry import source_delete, source_enable, source_rotate, source_upsert
from sources.rules import VERIFY, SourceState, settings_check, settings_parse
from sources.tallies import ACCEPTED, CHALLENGE, DUPLICATE, source_counts, source_refusals_recent
from web.admin.helpers import ChannelFilter, ServiceFormAdmin, admin_url, mask, table

logger = logging.getLogger("web.admin.channels")  # the admin's audit trail (web.admin.channels, consumer_actions)

_FORM_FIELDS = {  # form field -> the PUT's name (sources.rules.FIELDS)
    "verify": "verify", "new_secret": "secret", "signature_header": "signatureHeader", "algorithm": "algorithm",
    "encoding": "encoding", "signature_prefix": "signaturePrefix", "api_key_header": "apiKeyHeader",
    "dedupe": "dedupe", "dedupe_window_text": "dedupeWindow", "message_type": "messageType",
    "response_status": "responseStatus", "response_body": "responseBody",
    "response_content_type": "responseContentType",
}


class SourceForm(forms.ModelForm):
    """The PUT's fields, validated by the same rules (``sources.rules``); the secret write-only."""

    verify = forms.ChoiceField(choices=[(v, v) for v in VERIFY])
    new_secret = forms.CharField(
        label="Secret", required=False, strip=True, widget=forms.PasswordInput(render_value=False),
        help_text="The provider's signing secret (standard-webhooks: whsec_...; basic: user:password; api-key: the "
                  "key). Leave empty to keep the current one; a new one leaves the previous one verifying for "
                  "BROKER_SECRET_ROTATION_GRACE.")
    algorithm = forms.ChoiceField(choices=[("sha256", "sha256"), ("sha512", "sha512"), ("sha1", "sha1")],
                                  required=False, help_text="hmac only")
    encoding = forms.ChoiceField(choices=[("hex", "hex"), ("base64", "base64")], required=False, help_text="hmac only")
    dedupe = forms.CharField(required=False, help_text="header:NAME, json:dotted.path, body or none; empty: the "
                                                       "preset's (e.g. github header:X-GitHub-Delivery)")
    dedupe_window_text = forms.CharField(label="Dedupe window", required=False, initial="72h",
                                         help_text="90s, 15m, 12h, 7d (at most 30d)")
    message_type = forms.CharField(required=False, help_text="header:NAME, json:dotted.path, value:TYPE or none; "
                                                             "empty: the preset's (e.g. github header:X-GitHub-Event)")
    response_status = forms.IntegerField(required=False, initial=200, min_value=200, max_value=299)
    loaded_at = forms.IntegerField(required=False, widget=forms.HiddenInput)

    class Meta:
        model = Source
        fields = ("channel", "name", "signature_header", "signature_prefix", "api_key_header", "response_body",
                  "response_content_type", "enabled")
        help_texts = {"signature_header": "hmac: the header holding the signature",
                      "signature_prefix": "hmac: what precedes the digest, e.g. sha256=",
                      "api_key_header": "api-key: the header holding the key (default X-API-Key)",
                      "enabled": "A disabled source refuses every request (403 source_disabled)."}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        source = self.instance
        if source.pk:
            self.fields["loaded_at"].initial = int(source.updated_at.timestamp())
            self.fields["dedupe_window_text"].initial = duration_format(source.dedupe_window)
            self.fields["verify"].initial = source.verify
            self.fields["algorithm"].initial = source.algorithm
            self.fields["encoding"].initial = source.encoding
            self.fields["response_status"].initial = source.response_status
            self.fields["dedupe"].initial = source.dedupe or ""
            self.fields["message_type"].initial = source.message_type or ""
        for name in ("signature_header", "signature_prefix", "api_key_header", "response_body",
                     "response_content_type"):
            self.fields[name].required = False

    def clean(self):
        data = super().clean()
        raw = {}
        for name, put_name in _FORM_FIELDS.items():
            value = data.get(name)
            if value is None or (value == "" and name in ("algorithm", "encoding", "dedupe_window_text")):
                continue
            raw[put_name] = str(value)
        try:
            fields = settings_parse(raw)
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from None
        fields["enabled"] = bool(data.get("enabled"))
        source = self.instance if self.instance.pk else None
        if source is not None:  # unchanged values are not written again (a changed verify needs a new secret)
            fields = {k: v for k, v in fields.items() if k == "secret" or getattr(source, k) != v}
        try:  # the rules across fields, here so that the form shows them (the service checks them again)
            settings_check(new=_state(source, fields), old=_state(source, {}) if source else None, fields=fields)
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from None
        self.source_fields = fields
        return data


def _state(source: Source | None, fields: dict) -> SourceState:
    def value(name: str) -> str:
        return fields[name] if name in fields else (getattr(source, name) if source is not None else "")
    return SourceState(verify=value("verify"), secret=value("secret"), signature_header=value("signature_header"),
                       api_key_header=value("api_key_header"))


@admin.register(Source)
class SourceAdmin(ServiceFormAdmin):
    form = SourceForm
    list_display = ("name", "channel_col", "verify", "enabled", "url_col", "accepted_col", "duplicate_col",
                    "refused_col", "updated_at")
    list_filter = (ChannelFilter, "verify", "enabled")
    list_select_related = ("channel",)
    search_fields = ("name", "channel__channel_id", "=source_id")
    ordering = ("channel__channel_id", "name")
    actions = ("disable", "enable", "rotate_secret", "delete_selected")
    show_facets = admin.ShowFacets.NEVER

    def get_fieldsets(self, request, obj=None):
        settings_fields = ("verify", "new_secret", "signature_header", "algorithm", "encoding", "signature_prefix",
                           "api_key_header", "dedupe", "dedupe_window_text", "message_type", "response_status",
                           "response_body", "response_content_type", "enabled", "loaded_at")
        if obj is None:
            return ((None, {"fields": ("channel", "name")}), ("Settings", {"fields": settings_fields}))
        return ((None, {"fields": ("channel_col", "name", "url_col", "secret_col", "created_at", "updated_at")}),
                ("Settings", {"fields": settings_fields}),
                ("Requests", {"fields": ("counts_table", "refusals_table")}))

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("channel_col", "name", "url_col", "secret_col", "created_at", "updated_at", "counts_table",
                "refusals_table")

    # columns

    @admin.display(description="channel", ordering="channel__channel_id")
    def channel_col(self, obj):
        return obj.channel.channel_id

    @admin.display(description="address (give it to the provider)")
    def url_col(self, obj):
        path = f"/in/{obj.source_id}"
        base = settings.BROKER_PUBLIC_URL or settings.BROKER_PORTAL_URL
        return format_html("<code>{}</code>", f"{base}{path}" if base else path)

    @admin.display(description="secret")
    def secret_col(self, obj):
        text = mask(obj.secret) if obj.verify != "none" else "(none: verify none)"
        if obj.previous_secret and obj.previous_expires_at:
            text += f"; the previous one verifies until {obj.previous_expires_at:%Y-%m-%d %H:%M:%S} UTC"
        return text

    def _counts(self, obj) -> dict:
        return source_counts(source_pks=[obj.pk]).get(obj.pk, {})

    @admin.display(description="accepted")
    def accepted_col(self, obj):
        return f"{self._counts(obj).get(ACCEPTED, 0):,}"

    @admin.display(description="duplicates")
    def duplicate_col(self, obj):
        return f"{self._counts(obj).get(DUPLICATE, 0):,}"

    @admin.display(description="refused")
    def refused_col(self, obj):
        counts = self._counts(obj)
        return f"{sum(n for k, n in counts.items() if k not in (ACCEPTED, DUPLICATE, CHALLENGE)):,}"

    @admin.display(description="counts by outcome")
    def counts_table(self, obj):
        counts = self._counts(obj)
        rows = [[ACCEPTED, f"{counts.get(ACCEPTED, 0):,}"], [DUPLICATE, f"{counts.get(DUPLICATE, 0):,}"]]
        if counts.get(CHALLENGE):
            rows.append([CHALLENGE + " (Slack url_verification)", f"{counts[CHALLENGE]:,}"])
        rows += [[f"refused: {k}", f"{n:,}"] for k, n in sorted(counts.items())
                 if k not in (ACCEPTED, DUPLICATE, CHALLENGE) and n]
        return table(["outcome", "requests"], rows)

    @admin.display(description="last refusals")
    def refusals_table(self, obj):
        return table(["when (UTC)", "reason", "detail", "from"],
                     [[f"{r['at']:%Y-%m-%d %H:%M:%S}", r["reason"], r["detail"], r["remote"]]
                      for r in source_refusals_recent(source_pk=obj.pk)], empty="No refusals.")

    # writes through the services

    def save_model(self, request, obj, form, change):
        fields = dict(form.source_fields)
        loaded = form.cleaned_data.get("loaded_at")
        precondition = Precondition(http_date(loaded)) if change and loaded else None
        try:
            channel = obj.channel if not change else form.instance.channel
            saved, created = source_upsert(channel=channel, name=obj.name if not change else form.instance.name,
                                           fields=fields, precondition=precondition)
        except DomainError as exc:
            if isinstance(exc, PreconditionFailed):
                raise self.refused(PreconditionFailed(exc.code, "the source was changed by someone else since you "
                                                                "opened this page; reload it and try again")) from None
            raise self.refused(exc) from None
        obj.pk, obj.source_id, obj.updated_at = saved.pk, saved.source_id, saved.updated_at
        logger.info("admin user %s: %s source %s/%s", request.user.get_username(),
                    "created" if created else "changed", saved.channel.channel_id, saved.name)
        request.source_secrets_shown = [(saved, fields["secret"])] if "secret" in fields else []

    def response_add(self, request, obj, post_url_continue=None):
        return self._secret_page(request) or super().response_add(request, obj, post_url_continue)

    def response_change(self, request, obj):
        return self._secret_page(request) or super().response_change(request, obj)

    def _secret_page(self, request):
        shown = getattr(request, "source_secrets_shown", None)
        if not shown:
            return None
        response = TemplateResponse(request, "broker/source_secret.html", {
            **self.admin_site.each_context(request), "title": "Source saved", "opts": self.model._meta,
            "shown": [{"source": s, "secret": secret, "url": self.url_col(s)} for s, secret in shown]})
        response["Cache-Control"] = "no-store"  # the secret is on this page only
        return response

    def save_related(self, request, form, formsets, change):
        """No related objects are edited here."""

    def delete_model(self, request, obj):
        source_delete(source=obj)
        logger.info("admin user %s: deleted source %s/%s", request.user.get_username(), obj.channel.channel_id, obj.name)

    def delete_queryset(self, request, queryset):
        for source in queryset:
            self.delete_model(request, source)

    # actions

    @admin.action(description="Disable the selected sources (every request refused: 403)", permissions=["change"])
    def disable(self, request, queryset):
        self._enable(request, queryset, False)

    @admin.action(description="Enable the selected sources", permissions=["change"])
    def enable(self, request, queryset):
        self._enable(request, queryset, True)

    def _enable(self, request, queryset, enabled: bool) -> None:
        names = [f"{s.channel.channel_id}/{s.name}" for s in queryset if source_enable(source=s, enabled=enabled)]
        verb = "Enabled" if enabled else "Disabled"
        logger.info("admin user %s: %s sources %s", request.user.get_username(), verb.lower(), ", ".join(names) or "-")
        self.message_user(request, f"{verb} {len(names)} source{'s' if len(names) != 1 else ''}.", messages.SUCCESS)

    @admin.action(description="Rotate the secret of the selected sources (github, hmac, standard-webhooks, basic, "
                              "api-key: a new one is generated; the previous one verifies for the grace period)",
                  permissions=["change"])
    def rotate_secret(self, request, queryset):
        shown, refused = [], []
        for source in queryset:
            try:
                saved, secret = source_rotate(source=source)
            except DomainError as exc:
                refused.append(f"{source.channel.channel_id}/{source.name}: {exc.detail}")
                continue
            logger.info("admin user %s: rotated the secret of source %s/%s", request.user.get_username(),
                        saved.channel.channel_id, saved.name)
            shown.append((saved, secret))
        if refused:
            self.message_user(request, "Not rotated (set the provider's new secret on the source's page): "
                              + "; ".join(refused), messages.WARNING)
        request.source_secrets_shown = shown
        return self._secret_page(request)


def sources_of_channel_table(channel) -> str:
    """The channel page's list of its sources (web.admin.channels)."""
    sources = list(Source.objects.filter(channel=channel).order_by("name"))
    counts = source_counts(source_pks=[s.pk for s in sources])
    rows = []
    for s in sources:
        n = counts.get(s.pk, {})
        rows.append([format_html('<a href="{}">{}</a>', admin_url(s), s.name), s.verify,
                     "yes" if s.enabled else "no", f"{n.get(ACCEPTED, 0):,}", f"{n.get(DUPLICATE, 0):,}",
                     f"{sum(v for k, v in n.items() if k not in (ACCEPTED, DUPLICATE, CHALLENGE)):,}"])
    return table(["source", "verify", "enabled", "accepted", "duplicates", "refused"], rows, empty="No sources.")

