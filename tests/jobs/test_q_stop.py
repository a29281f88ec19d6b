"""``jobs.tasks.cluster_stop_probe``: the one function that reaches into django-q2 (the Sentinel on
a forked worker's stack, its ``stop_event``) and into multiprocessing (the event's ``_flag``). Run
against a real ``django_q.cluster.Sentinel`` forking a real ``django_q.worker.worker``, as
``qcluster`` does: an upgrade of django-q2 or Python that changes either internal fails here (the
worker would then learn of a stop only from its own SIGTERM: slots held until the loop's end)."""

from __future__ import annotations

import multiprocessing
import signal
import uuid

from django_q.cluster import Sentinel, get_mp_context
from django_q.signals import post_spawn

from jobs.tasks import cluster_stop_probe


def test_outside_a_worker_there_is_no_probe():
    assert cluster_stop_probe() is None


def test_a_forked_worker_sees_its_clusters_stop_event():
    context = get_mp_context()
    stop_event, start_event = context.Event(), context.Event()
    reports, report = multiprocessing.Pipe(duplex=False)

    def on_spawn(sender=None, proc_name=None, **kwargs):  # in the forked worker, as jobs.tasks.on_worker_spawn
        probe = cluster_stop_probe()
        report.send(("found", probe is not None, probe is not None and probe()))
        if probe is None:
            return
        start_event.wait(10)  # the test sets the stop event meanwhile
        report.send(("stopping", probe()))

    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    post_spawn.connect(on_spawn, dispatch_uid="test_q_stop")
    try:
        sentinel = Sentinel(stop_event, start_event, uuid.uuid4(), broker=object(), start=False)
        sentinel.spawn_worker()
        worker = sentinel.pool[0]
        assert reports.poll(30), "the worker did not report"
        # found, and not stopping yet
        assert reports.recv() == ("found", True, False), "no probe in the worker: django-q2 internals changed"
    finally:
        post_spawn.disconnect(dispatch_uid="test_q_stop")
        signal.signal(signal.SIGINT, handlers[0])  # (the Sentinel set the test process's own)
        signal.signal(signal.SIGTERM, handlers[1])
    try:
        stop_event.set()  # what the cluster's main process does on SIGTERM
        start_event.set()
        assert reports.poll(10)
        assert reports.recv() == ("stopping", True)
    finally:
        sentinel.task_queue.put("STOP")
        worker.join(10)
        if worker.is_alive():
            worker.kill()
            worker.join(5)
