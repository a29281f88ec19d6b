"""Helpers for pull-consumer tests: the spec's headers and JSON requests against consumer c2."""

from __future__ import annotations

import json

import pytest

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
    from jobs.wakeup import wakeups

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
