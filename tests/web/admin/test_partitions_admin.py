"""Partitions in the admin: the list and its filters, the partition page (gates, lease, jobs), the
job list filtered by partition, and the actions (retry, skip, advance, close) going through the
same ``jobs.partitions`` service functions as the API."""

from __future__ import annotations

import pytest

from broker.xid import job_xid
from jobs.models import Job, JobStatus, Partition, PartitionStatus
from jobs.pull.ack import jobs_ack_inflight
from jobs.pull.claim import jobs_claim
from tests.web.admin.conftest import consumer_pk

# transaction=True: a partition settles after the moves of its jobs commit (on_commit)
pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/jobs/partition/"


def publish(world, key: str, gate: int, n: int = 1) -> None:
    for _ in range(n):
        r = world.publish(HTTP_X_BROKER_PARTITION_KEY=key, HTTP_X_BROKER_GATE=str(gate))
        assert r.status_code == 201, r.content


def partition(key: str, consumer: str = "c2") -> Partition:
    return Partition.objects.get(key=key, consumer_id=consumer_pk(consumer))


def finish_gate(consumer: str, key: str, to_status: int) -> list[int]:
    """Claim every claimable job of the consumer (only the partition's current gate is claimable)
    and end it in ``to_status`` through the state machine."""
    claimed = jobs_claim(consumer_pk=consumer_pk(consumer), limit=100)
    assert claimed, "nothing claimable"
    jobs_ack_inflight(consumer_pk=consumer_pk(consumer), job_ids=[j.id for j in claimed],
                            to_statuses=[to_status] * len(claimed), delays=[None] * len(claimed), max_retry=5)
    return [j.id for j in claimed]


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def act(client, action: str, partitions: list[Partition]):
    return client.post(URL, {"action": action, "_selected_action": [str(p.pk) for p in partitions]}, follow=True)


def test_list_filters_and_page(admin_client, world):
    publish(world, "order-1", 0, n=3)
    publish(world, "order-1", 1)
    publish(world, "order-2", 0)
    finish_gate("c2", "order-1", JobStatus.DEAD)  # c2's gate-0 jobs of both partitions die
    assert partition("order-1").status == PartitionStatus.FAILED

    r = admin_client.get(URL, {"status__exact": PartitionStatus.FAILED, "consumer": consumer_pk("c2")})
    assert r.status_code == 200
    assert sorted(p.key for p in r.context["cl"].result_list) == ["order-1", "order-2"]
    r = admin_client.get(URL, {"consumer": consumer_pk("c1")})
    assert sorted(p.key for p in r.context["cl"].result_list) == ["order-1", "order-2"]
    assert all(p.status == PartitionStatus.AVAILABLE for p in r.context["cl"].result_list)
    r = admin_client.get(URL, {"q": "order-2"})
    assert [p.key for p in r.context["cl"].result_list] == ["order-2", "order-2"]  # one per consumer

    p = partition("order-1")
    r = admin_client.get(f"{URL}{p.pk}/change/")
    html = r.content.decode()
    assert r.status_code == 200 and "FAILED" in html and "order-1" in html
    assert "Jobs of this partition" in html and 'id="partition-retry"' in html
    # the gates table: 3 dead at gate 0, 1 queued at gate 1
    assert ">dead<" in html and ">queued<" in html
    rows = r.context["adminform"].form.instance  # the page shows the stored partition, read-only
    assert rows.pk == p.pk

    # jobs filtered by partition: the 4 jobs of c2's order-1
    r = admin_client.get("/admin/jobs/job/", {"partition": p.pk})
    assert r.status_code == 200
    assert sorted(j.pk for j in r.context["cl"].result_list) == sorted(
        Job.objects.filter(partition_id=p.pk).values_list("pk", flat=True))
    assert len(r.context["cl"].result_list) == 4
    job = Job.objects.filter(partition_id=p.pk).first()
    page = admin_client.get(f"/admin/jobs/job/{job_xid(job.pk)}/change/").content.decode()
    assert "order-1" in page


def test_retry_and_skip_actions(admin_client, world):
    publish(world, "a", 0, n=2)
    publish(world, "a", 1)
    publish(world, "b", 0)
    publish(world, "b", 1)
    finish_gate("c2", "a", JobStatus.DEAD)
    a, b = partition("a"), partition("b")
    assert a.status == b.status == PartitionStatus.FAILED

    r = act(admin_client, "retry", [a])
    assert r.status_code == 200
    text = " ".join(messages_of(r))
    assert "Retried 1 partition" in text and "2 jobs requeued" in text, text
    a.refresh_from_db()
    assert a.status == PartitionStatus.AVAILABLE and a.gate == 0
    assert Job.objects.filter(partition_id=a.pk, gate=0, status=JobStatus.QUEUED).count() == 2

    r = act(admin_client, "skip", [b])
    text = " ".join(messages_of(r))
    assert "Skipped 1 partition" in text and "1 job skipped" in text, text
    b.refresh_from_db()
    assert b.status == PartitionStatus.AVAILABLE and b.gate == 1  # moved on to its gate-1 job
    assert not Job.objects.filter(partition_id=b.pk, gate=0).exists()

    # retry on a partition with nothing dead changes nothing and says so
    r = act(admin_client, "advance", [b])
    assert "Not advanced" in " ".join(messages_of(r))


def test_advance_and_close_buttons(admin_client, api, world):
    publish(world, "m", 0)
    publish(world, "m", 2)
    p = partition("m")
    r = api.generic("PATCH", f"/channel/ch1/consumer/c2/partition/m", '{"manualCheckpoint": true}',
                    content_type="application/json")
    assert r.status_code == 200, r.content
    finish_gate("c2", "m", JobStatus.DELIVERED)
    p.refresh_from_db()
    assert p.gate == 0 and p.status == PartitionStatus.AVAILABLE  # manual checkpoint: waits for the operator

    r = admin_client.post(f"{URL}{p.pk}/act/advance/", follow=True)
    assert r.status_code == 200 and "Advanced 1 partition" in " ".join(messages_of(r))
    p.refresh_from_db()
    assert p.gate == 2

    r = admin_client.post(f"{URL}{p.pk}/act/close/", follow=True)
    assert "Closed 1 partition" in " ".join(messages_of(r))
    finish_gate("c2", "m", JobStatus.DELIVERED)
    p.refresh_from_db()
    assert p.closed and p.status == PartitionStatus.COMPLETE

    assert admin_client.get(f"{URL}{p.pk}/act/close/").status_code == 405
    # the form saves nothing: a POST of the change form leaves the partition as it was
    version = p.version
    admin_client.post(f"{URL}{p.pk}/change/", {"gate": 0})
    p.refresh_from_db()
    assert p.gate == 2 and p.version == version


def test_actions_need_change_permission(client, world):
    from django.contrib.auth.models import Permission, User

    publish(world, "x", 0)
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_partition"))
    client.force_login(viewer)
    p = partition("x")
    assert client.get(f"{URL}{p.pk}/change/").status_code == 200
    assert client.post(f"{URL}{p.pk}/act/close/").status_code == 403
    p.refresh_from_db()
    assert not p.closed
