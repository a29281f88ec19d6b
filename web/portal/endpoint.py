"""The portal's Endpoint page (push consumers): the callback URL, content filter, message types and
rate a team may change (``Save endpoint``: ``consumers.services.consumer_upsert`` under the page's
load time as If-Unmodified-Since, as the admin), ``Rotate secret`` (the previous secret keeps
signing for ``BROKER_SECRET_ROTATION_GRACE``; the new one is shown once, on the answer to the
rotation) and ``Send test event`` (a signed callback whose answer is shown on the page: its status
and timing, and its body when a public address answered)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.utils import timezone
from django.utils.http import http_date

from broker.errors import DomainError, PreconditionFailed, RateLimited
from broker.registry import Precondition
from consumers.filters import filter_text
from consumers.services import consumer_rotate_secret, consumer_upsert
from jobs.callbacks.probe import consumer_test_event_send
from web.portal.access import page_redirect, page_render, portal_page
from web.portal.forms import EndpointForm
from web.portal.links import PortalAccess, portal_change_record, portal_test_event_rate_take

# a refusal's code -> the field it is about (others are shown above the form)
ERROR_FIELDS = {"invalid_callback_url": "callback_url", "callback_url_not_allowed": "callback_url",
                "callback_url_required": "callback_url", "invalid_filter": "filter",
                "invalid_message_types": "message_types"}


def _page(request, access: PortalAccess, form=None, **extra):
    consumer = access.consumer
    if form is None and access.can_manage:
        form = EndpointForm(instance=consumer)
    previous = consumer.previous_secret_expires_at
    return page_render(request, access, "endpoint.html", "endpoint", title="Endpoint", form=form,
                       filter_json=filter_text(consumer.filter), **extra,
                       previous_until=previous if previous and previous > timezone.now() else None)


@portal_page(methods=("GET", "POST"))
def endpoint_view(request, access: PortalAccess):
    consumer = access.consumer
    if consumer.is_pull:
        return None  # no endpoint page: the portal's 404
    if request.method == "GET":
        return _page(request, access)
    form = EndpointForm(request.POST, instance=consumer)
    if form.is_valid():
        loaded = form.cleaned_data.get("loaded_at") or int(consumer.updated_at.timestamp())
        try:
            consumer_upsert(channel=consumer.channel, consumer_id=consumer.consumer_id, name=None, token=None,
                            callback_url=form.cleaned_data["callback_url"], type=None, settings=form.settings(),
                            precondition=Precondition(http_date(loaded)))
        except PreconditionFailed:
            form.add_error(None, "The endpoint was changed since you opened this page: reload it and try again.")
        except DomainError as exc:
            form.add_error(ERROR_FIELDS.get(exc.code), exc.detail)
        else:
            portal_change_record(access=access, action="endpoint_updated", fields=sorted(form.changed_data))
            messages.success(request, "Endpoint saved.")
            return page_redirect(access, "endpoint")
    return _page(request, access, form)


@portal_page(methods=("POST",))
def rotate_secret_view(request, access: PortalAccess):
    consumer = access.consumer
    if consumer.is_pull:
        return None
    grace = float(settings.BROKER_SECRET_ROTATION_GRACE)
    secret = consumer_rotate_secret(consumer=consumer, grace_seconds=grace)
    consumer.refresh_from_db(fields=["signing_secret", "previous_signing_secret", "previous_secret_expires_at",
                                     "updated_at"])
    portal_change_record(access=access, action="secret_rotated", grace_seconds=grace)
    return _page(request, access, new_secret=secret)  # shown once: this answer only (no-store)


@portal_page(methods=("POST",))
def test_event_view(request, access: PortalAccess):
    """``Send test event``: rate-limited per consumer (each holds a web thread up to the probe's
    timeout); the answer's body is shown only when a public address answered (``ProbeAnswer.public``),
    else only its status and timing."""
    consumer = access.consumer
    if consumer.is_pull:
        return None
    try:
        portal_test_event_rate_take(consumer=consumer)
    except RateLimited as exc:
        messages.warning(request, f"Too many test events for this consumer: try again in {exc.retry_after} s.")
        response = _page(request, access)
        response.status_code = 429
        response["Retry-After"] = str(exc.retry_after)
        return response
    answer = consumer_test_event_send(consumer=consumer)
    portal_change_record(access=access, action="test_event", status_code=answer.status_code,
                         duration_ms=round(answer.duration_ms, 1), error=answer.error)
    return _page(request, access, test_event=answer)
