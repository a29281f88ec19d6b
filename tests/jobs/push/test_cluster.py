"""The real thing: ``manage.py qcluster`` subprocesses delivering to a loopback receiver, one of
them killed with SIGKILL mid-delivery (at-least-once: nothing is lost)."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from django.core.management import call_command
from django.db import connection
from standardwebhooks import Webhook

from jobs.models import Job, JobStatus, JobTransition
from tests.jobs.conftest import Reply
from tests.processes import start_qcluster

pytestmark = pytest.mark.django_db(transaction=True)

ENV = {
    "BROKER_Q_WORKERS": "2",  # one dispatcher loop + one free worker
    "BROKER_PUSH_POLL": "0.2",
    "BROKER_RATIONAL_DELAY": "0.5",
    "BROKER_RETRY_BACKOFF": "0.5",
}


def test_qcluster_delivers_and_a_sigkilled_worker_loses_nothing(tmp_path, make, receiver, api):
    make.channel()
    make.producer()
    seen: set = set()
    lock = threading.Lock()

    def first_is_slow(n, request):
        mid = request.headers["x-broker-message-id"]
        with lock:
            first = mid not in seen
            seen.add(mid)
        return Reply(204, delay=1.5 if first else 0.0)

    receiver.behave("/cb", first_is_slow)
    make.consumer("c1", callback=receiver.url("/cb"), connectionTimeout="3", maxInFlight="4")
    secret = api.get("/channel/ch1/consumer/c1").json()["SigningSecret"]
    ids = [f"k{i}" for i in range(10)]
    for mid in ids:
        assert make.publish(body=b'{"k": 1}', HTTP_X_BROKER_MESSAGE_ID=mid).status_code == 201

    first = start_qcluster(tmp_path, **ENV)
    try:
        receiver.wait(lambda: len(receiver.at("/cb")) >= 3, timeout=60, what="callbacks in flight")
        first.kill(signal.SIGKILL)  # the whole cluster: sentinel, workers, dispatcher threads
        first.popen.wait(timeout=10)
        in_flight = Job.objects.filter(status=JobStatus.INFLIGHT).count()
        assert in_flight >= 1, first.output()[-3000:]
    finally:
        first.stop()

    second = start_qcluster(tmp_path, **ENV)
    try:
        receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == len(ids), timeout=60,
                      what="every job delivered by the second cluster")
    finally:
        second.stop()
    received = {r.headers["x-broker-message-id"] for r in receiver.at("/cb")}
    assert received == set(ids)
    # recovered by the owner check (jobs.sweeps.orphans), not by their deadline: no retry spent
    assert JobTransition.objects.filter(reason="orphaned").count() >= in_flight
    assert JobTransition.objects.filter(reason="timeout").count() == 0
    for request in receiver.at("/cb"):
        Webhook(secret).verify(request.body, request.headers)


def _pid_of_client_port(port: int) -> int | None:
    """The local process holding the TCP connection whose source port is ``port`` (via /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("socket:[").rstrip("]") in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def _dispatcher_pid() -> int | None:
    """The qcluster worker running a dispatcher loop: the one holding a slot connection."""
    with connection.cursor() as cur:
        cur.execute("SELECT client_port FROM pg_stat_activity WHERE application_name = 'broker-push-slot'"
                    " AND datname = current_database()")  # (not another test process's broker)
        row = cur.fetchone()
    return _pid_of_client_port(row[0]) if row and row[0] else None


def test_sigkilled_dispatcher_worker_is_replaced_and_its_jobs_delivered(tmp_path, make, receiver):
    make.channel()
    make.producer()
    seen: set = set()

    def first_is_slow(n, request):
        mid = request.headers["x-broker-message-id"]
        first = mid not in seen
        seen.add(mid)
        return Reply(204, delay=1.5 if first else 0.0)

    receiver.behave("/cb", first_is_slow)
    make.consumer("c1", callback=receiver.url("/cb"), connectionTimeout="3", maxInFlight="4")
    cluster = start_qcluster(tmp_path, **ENV)
    try:
        pid = receiver.wait(_dispatcher_pid, timeout=60, what="a dispatcher loop")
        for i in range(6):
            assert make.publish(HTTP_X_BROKER_MESSAGE_ID=f"w{i}").status_code == 201
        receiver.wait(lambda: len(receiver.at("/cb")) >= 2, timeout=30, what="callbacks in flight")
        os.kill(pid, signal.SIGKILL)  # only that worker; the cluster's guard starts a new one
        assert Job.objects.filter(status=JobStatus.INFLIGHT).exists()
        receiver.wait(lambda: Job.objects.filter(status=JobStatus.DELIVERED).count() == 6, timeout=60,
                      what="every job delivered after the worker's death")
        new_pid = _dispatcher_pid()
        assert new_pid is not None and new_pid != pid
    finally:
        cluster.stop()
    assert {r.headers["x-broker-message-id"] for r in receiver.at("/cb")} == {f"w{i}" for i in range(6)}


def test_setup_schedules_is_idempotent():
    from django_q.models import Schedule

    call_command("setup_schedules", verbosity=0)
    call_command("setup_schedules", verbosity=0)
    assert sorted(Schedule.objects.values_list("name", "func")) == [
        ("broker-maintenance", "jobs.tasks.maintenance"),
        ("broker-push-ensure", "jobs.tasks.push_dispatch_ensure"),
    ]


def test_maintenance_task_runs_the_sweeps():
    from jobs.tasks import maintenance

    assert set(maintenance()) >= {"expired", "scheduled", "compacted", "settled"}  # + partition settles (issue 16)
