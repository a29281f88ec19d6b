"""Helpers for pull-consumer tests: the spec's headers and JSON requests against consumer c2."""

from __future__ import annotations

import json

import pytest

from jobs.publish.auth import publish_authenticate
from jobs.publish.messages import NewMessage, messages_publish

PULL_HEADERS = {"HTTP_X_BROKER_CHANNEL_TOKEN": "ch-token", "HTTP_X_BROKER_CONSUMER_TOKEN": "c2-token"}
BASE = "/channel/ch1/consumer/c2"


class PullClient:
    """Speaks to one pull consumer through Django's test client (in-process)."""

    def __init__(self, client, base=BASE, headers=None):
        self.client = client
        self.base = base
        self.headers = dict(PULL_HEADERS if headers is None else headers)

    def queued(self, query=""):
        return self.client.get(f"{self.base}/queued-jobs{query}", **self.headers)

    def set_state(self, job_id, body, raw=None):
        data = raw if raw is not None else json.dumps(body)
        return self.client.generic("POST", f"{self.base}/job/{job_id}", data,
                                   content_type="application/json", **self.headers)

    def job(self, job_id):
        return self.client.get(f"{self.base}/job/{job_id}", **self.headers)

    def pull(self, **body):
        return self.client.generic("POST", f"{self.base}/pull", json.dumps(body),
                                   content_type="application/json", **self.headers)

    def ack(self, jobs, raw=None):
        data = raw if raw is not None else json.dumps({"Jobs": jobs})
        return self.client.generic("POST", f"{self.base}/ack", data, content_type="application/json",
                                   **self.headers)

    def progress(self, job_id, **body):
        return self.client.generic("POST", f"{self.base}/job/{job_id}/progress", json.dumps(body),
                                   content_type="application/json", **self.headers)

    def requeue(self, job_id):
        return self.client.generic("POST", f"{self.base}/job/{job_id}/requeue-dead-job", "", **self.headers)

    def delete(self, job_id):
        return self.client.generic("DELETE", f"{self.base}/job/{job_id}", "", **self.headers)

    def stats(self):
        r = self.client.get(self.base, **self.headers)
        assert r.status_code == 200, r.content
        return r.json()


@pytest.fixture(autouse=True, scope="session")
def _stop_wakeup_listener(django_db_setup, django_db_blocker):
    """Long-polls start this process's LISTEN thread; stop it before the test database is dropped."""
    yield
    from jobs.pull.wakeups import wakeups

    wakeups.stop()
    if wakeups._thread is not None:
        wakeups._thread.join(5)


@pytest.fixture
def pc(world, client_anon):
    return PullClient(client_anon)


def job_status(job_id):
    """(status name, retry count) of the job with this job ID (the xid the API shows)."""
    from broker.xid import job_pk
    from jobs.models import Job, JobStatus

    job = Job.objects.get(pk=job_pk(job_id))
    return JobStatus(job.status).name, job.retry_count


def publish_n(make, n, start=0, **headers):
    ids = []
    for i in range(start, start + n):
        r = make.publish(body=json.dumps({"n": i}).encode(), HTTP_X_BROKER_MESSAGE_ID=f"m{i}", **headers)
        assert r.status_code == 201, r.content
        ids.append(f"m{i}")
    return ids


def bulk_publish(n, priority=0, payload=b"x"):
    """n messages to ch1 in one fan-out statement (through the service, not HTTP)."""
    ctx = publish_authenticate(channel_id="ch1", channel_token="ch-token", producer_id="p1",
                               producer_token="p-token")
    messages_publish(ctx=ctx, messages=[NewMessage(payload=payload, priority=priority) for _ in range(n)])


def pull_one_short_deadline(world, pc, settings) -> str:
    """Publish one message and pull its job with an in-flight deadline of 0.75 s; the job's ID."""
    settings.BROKER_CONNECTION_TIMEOUT = 0.25
    settings.BROKER_RATIONAL_DELAY = 0.25
    publish_n(world, 1)
    return pc.pull().json()["Result"][0]["ID"]


def claim_one(pc, **body):
    """Claim the first queued job through the spec path (NextState INFLIGHT); its job ID."""
    jid = pc.queued().json()["Result"][0]["ID"]
    assert pc.set_state(jid, {"NextState": "INFLIGHT", **body}).status_code == 202
    return jid
