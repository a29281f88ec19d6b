"""Admin for event types (issue 37): list them by channel; add or edit one with its schema shown
formatted (a JSON text area) and its example; every version's schema on the page; delete. Saves and
deletes go through ``eventtypes.services`` (the PUT's and DELETE's rules: invalid_schema,
invalid_example, versions; the page's load time as If-Unmodified-Since)."""

from __future__ import annotations

import json
import logging

from django import forms
from django.contrib import admin
from django.utils.html import format_html

from broker.errors import DomainError, PreconditionFailed
from eventtypes.models import EventType
from eventtypes.rules import event_type_name_parse, example_parse, schema_parse
from eventtypes.services import EventTypeChange, event_type_delete, event_type_upsert, schema_current, versions_all
from web.admin.helpers import ChannelFilter, ServiceFormAdmin, json_block, table

logger = logging.getLogger("web.admin.event_types")
_JSON_AREA = {"rows": 18, "cols": 100, "class": "vLargeTextField", "spellcheck": "false",
              "style": "font-family: monospace"}


def json_text(value) -> str:
    return "" if value is None else json.dumps(value, indent=2, ensure_ascii=False)


class EventTypeForm(forms.ModelForm):
    schema_text = forms.CharField(
        label="Schema", required=False, strip=True, widget=forms.Textarea(attrs=_JSON_AREA),
        help_text="A JSON Schema (draft 2020-12); empty: no schema (any payload). A change is a new version.")
    example_text = forms.CharField(
        label="Example", required=False, strip=True, widget=forms.Textarea(attrs={**_JSON_AREA, "rows": 8}),
        help_text="An example payload (JSON); it must validate against the schema. Empty: none.")
    loaded_at = forms.IntegerField(required=False, widget=forms.HiddenInput)

    class Meta:
        model = EventType
        fields = ("channel", "name", "description", "deprecated")
        help_texts = {"name": "The message type (X-Broker-Message-Type): 1-128 characters of A-Z a-z 0-9 . _ : / -",
                      "deprecated": "Producers should stop sending it (still accepted)."}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["schema_text"].initial = json_text(schema_current(self.instance))
            self.fields["example_text"].initial = json_text(self.instance.example)
            self.fields["loaded_at"].initial = int(self.instance.updated_at.timestamp())

    def _domain(self, parse, *args, **kwargs):
        try:
            return parse(*args, **kwargs)
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from None

    def clean_name(self):
        return self._domain(event_type_name_parse, self.cleaned_data.get("name"))

    def clean_schema_text(self):
        return self._domain(schema_parse, self.cleaned_data.get("schema_text") or "", text=True)

    def clean_example_text(self):
        return self._domain(example_parse, self.cleaned_data.get("example_text") or "", text=True)

    def validate_unique(self):
        """The service decides (a second one of the same name updates it, as the PUT does)."""


@admin.register(EventType)
class EventTypeAdmin(ServiceFormAdmin):
    form = EventTypeForm
    list_display = ("name", "channel_col", "version", "deprecated", "updated_at")
    list_filter = (ChannelFilter, "deprecated")
    search_fields = ("name", "description")
    ordering = ("channel__channel_id", "name")
    list_select_related = ("channel",)
    show_facets = admin.ShowFacets.NEVER

    def get_fields(self, request, obj=None):
        fields = ["channel", "name", "description", "schema_text", "example_text", "deprecated"]
        if obj is not None:
            fields += ["version", "versions_table", "updated_at", "loaded_at"]
        return fields

    def get_readonly_fields(self, request, obj=None):
        return ("channel", "name", "version", "versions_table", "updated_at") if obj is not None else ()

    @admin.display(description="channel", ordering="channel__channel_id")
    def channel_col(self, obj):
        return obj.channel.channel_id

    @admin.display(description="versions")
    def versions_table(self, obj):
        return table(["version", "schema", "created"],
                     [[format_html("<strong>{}</strong>", v.version) if v.version == obj.version else v.version,
                       json_block(v.schema), f"{v.created_at:%Y-%m-%d %H:%M:%S}"]
                      for v in reversed(versions_all(obj))], empty="No versions.")

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        channel = obj.channel if change else data["channel"]
        name = obj.name if change else data["name"]
        since = data.get("loaded_at") if change else None
        try:
            result = event_type_upsert(channel=channel, name=name, unmodified_since=since, change=EventTypeChange(
                schema=data.get("schema_text"), description=data.get("description") or "",
                example=data.get("example_text"), deprecated=bool(data.get("deprecated"))))
        except DomainError as exc:
            if isinstance(exc, PreconditionFailed):
                raise self.refused(PreconditionFailed(exc.code, "the event type was changed by someone else since "
                                                                "you opened this page; reload it and try again")) from None
            raise self.refused(exc) from None
        logger.info("admin user %s: event type %s/%s %s", request.user.get_username(), channel.channel_id, name,
                    result.action)
        obj.pk = result.event_type.pk
        obj.updated_at = result.event_type.updated_at

    def save_related(self, request, form, formsets, change):
        """No related objects are edited here."""

    def delete_model(self, request, obj):
        event_type_delete(channel=obj.channel, name=obj.name)

    def delete_queryset(self, request, queryset):
        for obj in queryset.select_related("channel"):
            try:
                event_type_delete(channel=obj.channel, name=obj.name)
            except DomainError:
                pass  # deleted meanwhile
