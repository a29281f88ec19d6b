"""One pull request (``POST .../pull``) from its parsed body to the jobs it hands out: the checks of
the request against the consumer's priority policy, then either the plain claim with its long-poll
wait (``jobs.pull.claim.jobs_pull``) or the priority-group dispatcher (``jobs.pull.groups``). The
one place that decides between the two, so every route that pulls answers alike."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.errors import Locked
from consumers.priority import NONE, PINNED
from jobs.pull.auth import PullContext
from jobs.pull.claim import ClaimedJob, PullRequest, jobs_pull, pull_request_check
from jobs.pull.groups import jobs_pull_grouped
from jobs.pull.traces import claim_spans, now_ns


@dataclass
class Served:
    jobs: list[ClaimedJob] = field(default_factory=list)
    pin_id: str = ""  # pinned_client: the pin the jobs were handed out under ('' otherwise)


def pull_serve(*, ctx: PullContext, req: PullRequest) -> Served:
    """The jobs for one pull request. A pinned_client pull with another client's pin id that gets
    no job is a 423 ``wrong_pin_id`` (the pin moved; NATS answers Nats-Wrong-Pin-Id)."""
    pull_request_check(ctx=ctx, req=req)
    started = now_ns()  # the claim spans (OpenTelemetry only) cover the claim
    if ctx.policy == NONE:
        jobs = jobs_pull(ctx=ctx, req=req)
        claim_spans(ctx=ctx, jobs=jobs, start_ns=started)
        return Served(jobs=jobs)
    result = jobs_pull_grouped(ctx=ctx, req=req)
    if result.wrong_pin and not result.jobs:
        raise Locked("wrong_pin_id", "Nats-Wrong-Pin-Id")
    claim_spans(ctx=ctx, jobs=result.jobs, start_ns=started)
    return Served(jobs=result.jobs, pin_id=result.pin_id if result.jobs and ctx.policy == PINNED else "")
