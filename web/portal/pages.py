"""The portal's pages for one consumer: Overview, Deliveries (and a job's page), Dead letters (with
Requeue and Requeue all) and Replay. The push endpoint's page is ``web.portal.endpoint``.

Each page reads through the services the admin and the API use (maintained counters, the
per-minute statistics, the bounded attempt reads of ``jobs.ops.deliveries``, the DLQ listing)
and changes through the same writers (``jobs_requeue_dead``, ``consumer_replay``); every change
is recorded as an advisory naming the link.
"""

from __future__ import annotations

from django.contrib import messages
from django.db.models import BooleanField, ExpressionWrapper, Q

from broker.errors import DomainError
from broker.xid import job_pk, job_xid
from jobs.models import Job
from jobs.ops.consumer_stats import consumer_stats
from jobs.ops.dashboard import minute_series
from jobs.ops.dead_jobs import dead_jobs_listed, jobs_requeue_dead
from jobs.ops.deliveries import consumer_attempt_figures, consumer_attempts
from jobs.push.circuit import circuit_state
from web import svg
from web.admin.consumer_forms import ReplayForm
from web.admin.job_detail import attempts_table, history_table, job_payload, message_headers
from web.admin.jobs import status_badge
from web.portal.access import denied_page, page_redirect, page_render, portal_page
from web.portal.forms import OutcomeForm
from web.portal.links import PortalAccess, portal_change_record, portal_changes
from web.portal.replays import portal_replay_start, portal_replays

PAGE = 25  # rows per page of deliveries and dead letters


@portal_page
def overview_view(request, access: PortalAccess):
    consumer = access.consumer
    stats = consumer_stats(consumer_pk=consumer.pk, sweep=consumer.is_pull)
    series = minute_series(consumer_pks=[consumer.pk]).get(consumer.pk)
    figures = None if consumer.is_pull else consumer_attempt_figures(consumer_pk=consumer.pk)
    return page_render(request, access, "overview.html", "overview", title="Overview", stats=stats, figures=figures,
                   windows=[("Last hour", figures.hour), ("Last day", figures.day)] if figures else [],
                   circuit=None if consumer.is_pull else circuit_state(consumer=consumer),
                   chart=svg.minute_chart(delivered=series.delivered, failed=series.failed, width=720,
                                          title="Attempts per minute, last hour") if series else None)


@portal_page
def deliveries_view(request, access: PortalAccess):
    form = OutcomeForm(request.GET)
    outcome = before = None
    if form.is_valid():
        outcome, before = form.cleaned_data["outcome"] or None, form.cleaned_data["before"]
    page = consumer_attempts(consumer_pk=access.consumer.pk, before=before, outcome=outcome, limit=PAGE)
    rows = [{"attempt": a, "job": job_xid(a.job_id)} for a in page.attempts]
    return page_render(request, access, "deliveries.html", "deliveries", title="Deliveries", rows=rows, page=page,
                       outcome=outcome or "", outcomes=form.fields["outcome"].choices, first=before is not None)


@portal_page
def job_view(request, access: PortalAccess, job_id: str):
    pk = job_pk(job_id)
    job = (Job.objects.filter(pk=pk, consumer_id=access.consumer.pk).select_related("message")
           .defer("payload", "message__payload", "message__headers")
           .annotate(own=ExpressionWrapper(Q(payload__isnull=False), output_field=BooleanField())).first()
           if pk is not None else None)
    if job is None:
        return None  # another consumer's job, or none: the portal's 404
    return page_render(request, access, "job.html", "deliveries", title=f"Job {job_xid(job.pk)}", job=job,
                   job_id=job_xid(job.pk), status=status_badge(job.status), attempts=attempts_table(job.pk),
                   history=history_table(job.pk), headers=message_headers(job.message_id),
                   payload=job_payload(job_pk=job.pk, message_pk=job.message_id, own=job.own))


@portal_page
def dead_letters_view(request, access: PortalAccess):
    consumer = access.consumer
    dead = dead_jobs_listed(consumer_pk=consumer.pk, last_attempt=True).select_related("message").only(
        "id", "retry_count", "status_changed_at", "message__message_id")
    before = request.GET.get("before", "")
    if before.isdigit():
        dead = dead.filter(pk__lt=int(before))
    rows = list(dead[:PAGE + 1])
    return page_render(request, access, "dead_letters.html", "dead_letters", title="Dead letters",
                   rows=[{"job": j, "id": job_xid(j.pk)} for j in rows[:PAGE]],
                   older=rows[PAGE - 1].pk if len(rows) > PAGE else None, first=before.isdigit(),
                   dead=consumer_stats(consumer_pk=consumer.pk)["NumDead"])


@portal_page(methods=("POST",))
def requeue_view(request, access: PortalAccess):
    """``Requeue`` one dead letter (the DLQ's writer, for this consumer's job only)."""
    pk = job_pk(request.POST.get("job", ""))
    moved = jobs_requeue_dead(consumer_pk=access.consumer.pk, job_ids=[pk], reason="portal-requeue") if pk else 0
    if moved:
        portal_change_record(access=access, action="dead_requeued", jobs=[job_xid(pk)], requeued=moved)
        messages.success(request, f"Requeued job {job_xid(pk)}.")
    else:
        messages.warning(request, "Nothing requeued: that job is no longer a dead letter (or its message expired).")
    return page_redirect(access, "dead_letters")


@portal_page(methods=("GET", "POST"))
def requeue_all_view(request, access: PortalAccess):
    """``Requeue all``: asks first (GET), then requeues every dead letter of the consumer (POST)."""
    if not access.can_manage:
        return denied_page(request, "read")
    if request.method == "GET":
        return page_render(request, access, "confirm_requeue_all.html", "dead_letters", title="Requeue all dead letters?",
                       dead=consumer_stats(consumer_pk=access.consumer.pk)["NumDead"])
    moved = jobs_requeue_dead(consumer_pk=access.consumer.pk, reason="portal-requeue")
    portal_change_record(access=access, action="dead_requeued", jobs="all", requeued=moved)
    messages.success(request, f"Requeued {moved:,} dead letter{'' if moved == 1 else 's'}.")
    return page_redirect(access, "dead_letters")


@portal_page(methods=("GET", "POST"))
def replay_view(request, access: PortalAccess):
    """``Replay`` since a time: queued as a task (``web.portal.replays``: the same replay as the API's,
    in turns, one at a time per consumer); the page shows it queued, running and done."""
    form = ReplayForm(request.POST or None, label_suffix="") if access.can_manage else None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            replay = portal_replay_start(access=access, since=data["since"], until=data.get("until"),
                                         only_failed=data["only_failed"])
        except DomainError as exc:
            form.add_error(None, exc.detail)
        else:
            messages.success(request, f"Replay {replay.pk} {'done' if replay.state == 'done' else 'started'}: "
                                      f"{replay.replayed:,} message{'' if replay.replayed == 1 else 's'} replayed"
                                      f"{'' if replay.state == 'done' else ' so far'}.")
            return page_redirect(access, "replay")
    return page_render(request, access, "replay.html", "replay", title="Replay", form=form,
                       portal_replays=portal_replays(consumer_pk=access.consumer.pk),
                       replays=portal_changes(consumer_pk=access.consumer.pk, types=("replay",), limit=10))
