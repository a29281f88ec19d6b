"""The statements the plan tests explain beside the hot statements of the registries
(``jobs.ops.plans.CASES``, the table ``manage.py broker_plans`` checks on a live database): the ORM
statements of the hot pages (the DLQ list, the admin's job list), which Django plans with their values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from jobs.state.transitions import QUEUED


@dataclass(frozen=True)
class OrmCase:
    name: str
    index: str | tuple[str, ...]  # the index(es) it must use ("a|b": either)
    sql: Callable  # (world) -> (sql, params)
    sorts: str = ""  # why a Sort is bounded by design, if it is
    hashes: str = ""  # why a Hash is, if it is


def _dlq_list(w):
    from django.db.models import OuterRef, Subquery

    from jobs.models import Job, JobStatus, JobTransition

    reason = JobTransition.objects.filter(job_id=OuterRef("pk"), to_status=JobStatus.DEAD).order_by("-id")
    qs = Job.objects.filter(consumer_id=w.pull, status=JobStatus.DEAD).select_related("message").annotate(
        dead_reason=Subquery(reason.values("reason")[:1])).order_by("-pk")[:26]  # web.api.dlq: with Reason
    return qs.query.sql_with_params()


def _admin_jobs(w, **query):
    """The admin's job list query for a GET with these filters (its changelist, first page)."""
    from types import SimpleNamespace

    from django.contrib import admin
    from django.test import RequestFactory

    from jobs.models import Job

    request = RequestFactory().get("/admin/jobs/job/", {k: str(v) for k, v in query.items()})
    request.user = SimpleNamespace(is_active=True, is_staff=True, is_superuser=True, has_perm=lambda *a, **k: True)
    changelist = admin.site._registry[Job].get_changelist_instance(request)
    return changelist.get_queryset(request)[:100].query.sql_with_params()


ORM_CASES: list[OrmCase] = [
    # dead jobs only: either index keeps a page's cost independent of the backlog; for a consumer
    # the statistics call small, a custom plan may fetch and sort its few dead jobs
    OrmCase("dlq list", "job_consumer_status|job_dead", _dlq_list, sorts="one consumer's dead jobs"),
    OrmCase("admin job list", "jobs_job_pkey", _admin_jobs),
    # one consumer's QUEUED jobs newest first: job_consumer_status in its order, or (for a consumer
    # the statistics call small) its rows from job_claim, sorted or hashed into a join (PostgreSQL 15,
    # CI); either is bounded by that consumer's jobs
    OrmCase("admin job list (status, consumer)", "job_consumer_status|job_claim",
            lambda w: _admin_jobs(w, status__exact=QUEUED, consumer=w.pull), sorts="one consumer's queued jobs",
            hashes="one consumer's queued jobs, when the statistics call that consumer small"),
]
