"""Pieces shared by the broker's ModelAdmins: masked secrets, a paginator that never counts a big
table, payload previews, and routing admin writes through the service functions."""

from __future__ import annotations

import json
from html import escape
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.core.validators import RegexValidator
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.http import http_date
from django.utils.safestring import SafeString, mark_safe

from broker.counters import counts_for
from broker.errors import DomainError
from broker.models import Channel
from broker.payloads import message_payload_head, scheduled_payload_head
from broker.registry import Precondition
from jobs.ops.payloads import job_payload_head

MASK = "\u2022" * 4

# An id ends up in the API's URL paths (/channel/<id>/consumer/<id>): no slash, no blank.
url_id_validator = RegexValidator(r"^[^/\s]+$", "No slashes or spaces: the id is part of the API's URLs.")


def mask(value: str | None) -> str:
    """A secret for display: its last four characters at most, and none of a short one."""
    if not value:
        return "(none)"
    return MASK + value[-4:] if len(value) >= 12 else MASK


def precondition_for(updated_at) -> Precondition:
    """The If-Unmodified-Since an API client would send after reading the row at ``updated_at``."""
    return Precondition(http_date(int(updated_at.timestamp())))


def admin_url(obj, *, action: str = "change") -> str:
    opts = obj._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{action}", args=[obj.pk])


def changelist_url(model, **params) -> str:
    opts = model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    return f"{url}?{urlencode(params)}" if params else url


# --- pagination without COUNT(*) --------------------------------------------------------------------

class CappedCountPaginator(Paginator):
    """Counts at most ``cap`` rows (``SELECT count(*) FROM (... LIMIT cap + 1)``), or takes an exact
    count from ``exact_count`` (maintained counters) when that can answer for the current filters.
    ``capped`` tells the templates to show "10,000+". Pair with ``show_full_result_count = False``.
    """

    def __init__(self, object_list, per_page, orphans=0, allow_empty_first_page=True, *,
                 cap: int = 10_000, exact_count=None):
        super().__init__(object_list, per_page, orphans, allow_empty_first_page)
        self.cap = cap
        self.exact_count = exact_count
        self.capped = False

    @cached_property
    def count(self) -> int:
        if self.exact_count is not None:
            exact = self.exact_count()
            if exact is not None:
                return exact
        n = self.object_list.order_by()[: self.cap + 1].count()
        self.capped = n > self.cap
        return min(n, self.cap)


# change_view context of a page that shows an object and offers its own actions instead of a form
VIEW_ONLY = {"show_save": False, "show_save_and_continue": False, "show_save_and_add_another": False,
             "show_delete": False}


class LargeTableAdmin(admin.ModelAdmin):
    """For tables with millions of rows: no full count, no facet counts, sort by id only."""

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 50
    list_max_show_all = 200
    sortable_by = ("id",)
    ordering = ("-id",)
    count_cap = 10_000
    # For tables counted per channel by the maintained counters (messages, scheduled messages):
    # the counters' scope, so a list filtered only by channel and status gets its exact count.
    channel_counter_scope: int | None = None
    IGNORED_COUNT_PARAMS = {"p", "o", "all", "e", "_changelist_filters", "_to_field", "_popup"}

    def exact_count(self, request) -> int | None:
        """An exact count for the request's filters from maintained data, or None."""
        if self.channel_counter_scope is None:
            return None

        params = {k: v for k, v in request.GET.items() if k not in self.IGNORED_COUNT_PARAMS}
        if set(params) - {"channel", "status__exact"} or any(not v.isdigit() for v in params.values()):
            return None
        owners = [int(params["channel"])] if "channel" in params else None
        counts = counts_for(scope=self.channel_counter_scope, owner_ids=owners)
        status = int(params["status__exact"]) if "status__exact" in params else None
        return sum(n for per in counts.values() for s, n in per.items() if status is None or s == status)

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        return CappedCountPaginator(queryset, per_page, orphans, allow_empty_first_page, cap=self.count_cap,
                                    exact_count=lambda: self.exact_count(request))


class ViewOnlyAdmin(LargeTableAdmin):
    """A large table whose change page shows its object and offers the page's own actions instead of
    a form (VIEW_ONLY); ``page_context`` adds what the page's template needs."""

    def page_context(self, request, object_id) -> dict:
        return {}

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {**VIEW_ONLY, **self.page_context(request, object_id), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)


class ReadOnlyAdmin(LargeTableAdmin):
    """History and message tables: nothing is added, changed or deleted through the admin."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# --- filters -------------------------------------------------------------------------------------------

class NumberFilter(admin.SimpleListFilter):
    """A list filter whose values are numbers (``filter_number``); any other value matches nothing,
    so a hand-edited URL never errors."""

    def filter_number(self, queryset, n: int):
        raise NotImplementedError

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if not value.isdigit():
            return queryset.none()
        return self.filter_number(queryset, int(value))


class ChannelFilter(NumberFilter):
    """By channel, for any model with a ``channel`` foreign key (the channels table is small)."""

    title = "channel"
    parameter_name = "channel"

    def lookups(self, request, model_admin):
        return list(Channel.objects.order_by("channel_id").values_list("pk", "channel_id")[:500])

    def filter_number(self, queryset, n: int):
        return queryset.filter(channel_id=n)


# --- writes through the services ----------------------------------------------------------------

class ServiceRefused(Exception):
    """A service refused an admin write (a DomainError); shown as an error message."""


class ServiceFormAdmin(admin.ModelAdmin):
    """Saves go through the same service function as the HTTP API (``save_model`` calls it and
    may raise ServiceRefused); a refusal rolls the request back and is reported, not a 500."""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ServiceRefused as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    @staticmethod
    def refused(exc: DomainError) -> ServiceRefused:
        return ServiceRefused(f"Not saved: {exc.detail}.")


# --- payload preview ------------------------------------------------------------------------------

# table -> the reader of a row's payload head (a job's own payload, set by a handler-driven gate
# move, takes its message's content type)
_PREVIEW_READERS = {
    "broker_message": message_payload_head,
    "broker_scheduledmessage": scheduled_payload_head,
    "jobs_job": job_payload_head,
}


def payload_preview(*, table: str, pk: int) -> SafeString:
    """The payload of one message for display: pretty-printed when it is JSON, at most
    BROKER_ADMIN_PAYLOAD_PREVIEW_BYTES read from the database (a 5 MB payload is never loaded)."""
    if table not in _PREVIEW_READERS:
        raise ValueError(table)
    limit = int(getattr(settings, "BROKER_ADMIN_PAYLOAD_PREVIEW_BYTES", 65536))
    row = _PREVIEW_READERS[table](pk=pk, limit=limit)
    if row is None:
        return mark_safe("")
    head, size, content_type = row
    truncated = size > len(head)
    text = _utf8(head, truncated)
    if text is None:
        shown = head[:512]
        body = " ".join(f"{b:02x}" for b in shown)
        note = f"binary, {size:,} bytes; first {len(shown):,} bytes in hex"
        return format_html('<p class="help">{}</p><pre class="payload">{}</pre>', note, body)
    kind = "text"
    if not truncated and ("json" in content_type.lower() or text.lstrip()[:1] in ("{", "[")):
        try:
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            kind = "JSON"
        except ValueError:
            pass
    note = f"{kind}, {size:,} bytes" + (f"; showing the first {len(head):,}" if truncated else "")
    return format_html('<p class="help">{}</p><pre class="payload">{}</pre>', note, text)


def _utf8(data: bytes, truncated: bool) -> str | None:
    """Decode UTF-8; a truncated preview may end inside a character, so try dropping up to three
    trailing bytes before calling it binary."""
    for cut in range(4 if truncated else 1):
        try:
            return (data[: len(data) - cut] if cut else data).decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def json_block(value) -> SafeString:
    if not value:
        return mark_safe('<span class="quiet">(none)</span>')
    return format_html('<pre class="payload">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False))


def table(headers: list[str], rows: list[list], *, empty: str = "None") -> SafeString:
    """A small read-only HTML table for detail pages (cells are escaped unless already safe)."""
    if not rows:
        return format_html('<span class="quiet">{}</span>', empty)

    def cell(value) -> str:
        if isinstance(value, SafeString):
            return str(value)
        return escape("" if value is None else str(value))

    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return mark_safe(f'<table class="detail-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')  # noqa: S308
