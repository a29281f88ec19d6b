"""The consumer admin's forms: a consumer's settings, checked as the consumer API checks them
(callback URL, positive limits, backoff steps, message type patterns), and the replay window."""

from __future__ import annotations

from django import forms
from django.conf import settings

from broker.errors import DomainError, InvalidInput
from broker.message_types import message_types_parse, message_types_text
from consumers import services
from consumers.filters import filter_parse, filter_text
from consumers.models import Consumer
from web.admin.helpers import url_id_validator


class ConsumerForm(forms.ModelForm):
    new_token = forms.CharField(
        required=False, strip=True, widget=forms.PasswordInput(render_value=False),
        help_text="Leave empty to keep the current token (a new consumer gets a generated one).")
    loaded_at = forms.IntegerField(required=False, widget=forms.HiddenInput)
    max_ack_pending = forms.IntegerField(
        required=False, min_value=1, max_value=2**31 - 1,
        help_text="Flow control: at most this many jobs in flight (empty: 1000).")
    max_queued = forms.IntegerField(
        required=False, min_value=1,
        help_text="Flow control: publishing answers 429 backlog_full at this many QUEUED jobs (empty: unlimited).")
    notify_interval = forms.FloatField(
        required=False, help_text="Doorbell (pull consumers with a callback URL): at most one ring per this many "
                                  "seconds (empty: 1).")
    message_types = forms.CharField(
        required=False, label="Message types", max_length=10000,
        help_text="Filters: comma-separated type patterns (order.created, order.* for order and anything under "
                  "it, * for all). Empty: every message.")
    circuit_breaker_failures = forms.IntegerField(
        required=False, min_value=0, max_value=2**31 - 1,
        help_text="Circuit breaker (push): consecutive failed attempts that open the circuit (empty: 10, 0: off).")
    circuit_breaker_probe_seconds = forms.FloatField(
        required=False, help_text="Circuit breaker: seconds between probe deliveries while open (empty: 30).")
    circuit_breaker_open_after_seconds = forms.FloatField(
        required=False, min_value=0, max_value=1e9, help_text="Circuit breaker: open only after failing this many seconds with no "
                                               "successful attempt (empty: 10, 0: on the failures alone).")
    filter = forms.CharField(
        required=False, label="Filter", max_length=16384, widget=forms.Textarea(attrs={"rows": 3}),
        help_text='Content filter (JSON), e.g. {"body": {"order.total": {"$gt": 100}}, "headers": {"X-Tenant": "acme"}}. '
                  "Empty: every message.")

    class Meta:
        model = Consumer
        fields = ("channel", "consumer_id", "name", "type", "callback_url", "max_in_flight",
                  "max_deliveries_per_second", "connection_timeout", "max_retry", "retry_backoff",
                  "max_ack_pending", "max_queued", "notify_interval", "message_types", "circuit_breaker_failures",
                  "circuit_breaker_probe_seconds", "circuit_breaker_open_after_seconds", "filter")
        help_texts = {
            "max_deliveries_per_second": "Empty: no rate limit.",
            "connection_timeout": f"Seconds. Empty: the broker default ({settings.BROKER_CONNECTION_TIMEOUT:g}).",
            "max_retry": f"Empty: the broker default ({settings.BROKER_MAX_RETRY}).",
            "retry_backoff": "Comma-separated seconds, e.g. 5,30,60. Empty: the broker default.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk and "loaded_at" in self.fields:
            self.fields["loaded_at"].initial = int(self.instance.updated_at.timestamp())
        if "name" in self.fields:
            self.fields["name"].required = False
        if "consumer_id" in self.fields:
            self.fields["consumer_id"].validators.append(url_id_validator)
        if "message_types" in self.fields:  # shown as the API takes it: comma-separated
            self.initial["message_types"] = message_types_text(self.instance.message_types)
        if "filter" in self.fields:  # shown as the API takes it: JSON text
            self.initial["filter"] = filter_text(self.instance.filter)

    def clean_filter(self):
        try:
            return filter_parse(self.cleaned_data.get("filter") or "")
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from None

    def clean_message_types(self):
        try:
            return message_types_parse(self.cleaned_data.get("message_types") or "") or None
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from None

    def clean(self):
        data = super().clean()
        ctype = data.get("type") or getattr(self.instance, "type", Consumer.Type.PUSH)
        url = data.get("callback_url", getattr(self.instance, "callback_url", "")) or ""
        try:
            if url:
                services.callback_url_validate(url)
            elif ctype == Consumer.Type.PUSH:
                raise InvalidInput("callback_url_required", "a push consumer needs an absolute callback URL")
        except DomainError as exc:
            self.add_error("callback_url", exc.detail)
        if data.get("max_in_flight") is not None and data["max_in_flight"] < 1:
            self.add_error("max_in_flight", "must be at least 1")
        for name in ("max_deliveries_per_second", "connection_timeout", "notify_interval",
                     "circuit_breaker_probe_seconds"):
            value = data.get(name)
            if value is not None and not 0 < value < 1e9:
                self.add_error(name, "must be positive")
        raw = (data.get("retry_backoff") or "").strip()
        if raw:
            try:
                data["retry_backoff"] = services.retry_backoff_parse(raw)
            except InvalidInput as exc:
                self.add_error("retry_backoff", f"{exc.detail}, e.g. 5,30,60")
        return data


class ReplayForm(forms.Form):
    """The admin's replay: a window (UTC) and "only failed", as the API's JSON body."""

    since = forms.DateTimeField(label="Since (UTC)", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"])
    until = forms.DateTimeField(label="Until (UTC, empty: now)", required=False,
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"])
    only_failed = forms.BooleanField(label="Only failed (DEAD) jobs", required=False)

