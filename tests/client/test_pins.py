"""Priority groups through the client against a real broker: the pin protocol of pinned_client
(keep the pin id, drop it on 423 and pull again as a standby), hand-over between two consume()
loops when the pinned one stops, unpin, and overflow thresholds."""

from __future__ import annotations

import threading
import time


def pinned(world, timeout=2):
    world.consumer("pin", token="pint", priorityPolicy="pinned_client", priorityGroups=["A"],
                   priorityTimeout=timeout)
    return lambda: world.pull_consumer("pin", "pint", group="A")


def advisories(world):
    r = world.admin.get(f"{world.url}/channel/ch/consumer/pin/advisories")
    assert r.status_code == 200, r.text
    return [(a["type"], a.get("pinned_id"), a.get("reason")) for a in r.json()["Result"]]


def test_fetch_keeps_the_pin_and_a_stale_pin_is_dropped_on_423(world):
    make = pinned(world, timeout=2)
    a, b = make(), make()
    producer = world.producer()
    producer.publish("one")
    [job] = a.fetch(batch=1, expires=5)
    old = a.pin_id
    assert old and job.pin_id == old
    job.ack()
    got: dict = {}
    standby = threading.Thread(target=lambda: got.setdefault("jobs", b.fetch(batch=1, expires=15)))
    standby.start()
    world.wait(lambda: world.stats("pin")["NumWaiting"] == 1, what="the standby")
    time.sleep(2.5)  # a is silent for longer than priorityTimeout: the pin lapses
    producer.publish("two")
    standby.join(20)
    [second] = got["jobs"]
    assert second.text() == "two" and b.pin_id and b.pin_id != old
    # a still holds the old id: its pull gets 423 pin_id_mismatch, drops the id and waits as a standby
    assert a.fetch(batch=1, expires=1) == [] and a.pin_id is None
    second.ack()
    assert advisories(world) == [("consumer_group_pinned", old, None), ("consumer_group_unpinned", None, "timeout"),
                                 ("consumer_group_pinned", b.pin_id, None)]


def test_pin_hand_over_between_two_consume_loops(world):
    make = pinned(world, timeout=2)
    loops = {"a": make(), "b": make()}
    got: dict[str, list] = {"a": [], "b": []}
    threads = {}
    for name, consumer in loops.items():
        def run(name=name, consumer=consumer):
            # batch 100, expires 30: on a pinned consumer the client long-polls at most
            # priorityTimeout / 2, so the pinned loop keeps its pin while it waits
            consumer.consume(lambda job, name=name: got[name].append(job.text()), batch=100, expires=30)

        threads[name] = threading.Thread(target=run, daemon=True)
        threads[name].start()
    world.wait(lambda: world.stats("pin")["NumWaiting"] == 2, what="two waiting loops")
    producer = world.producer()
    for i in range(5):
        producer.publish(f"first {i}")
    world.wait(lambda: len(got["a"]) + len(got["b"]) == 5, what="the first five")
    holder = "a" if got["a"] else "b"
    other = "b" if holder == "a" else "a"
    assert not got[other]  # one pinned client gets everything
    time.sleep(3.0)  # the pinned loop keeps renewing its pin with its pulls
    producer.publish("still pinned")
    world.wait(lambda: len(got[holder]) == 6, what="the sixth job at the pin")
    assert not got[other]
    pin = loops[holder].pin_id
    loops[holder].stop()
    threads[holder].join(35)
    assert not threads[holder].is_alive()
    for i in range(3):
        producer.publish(f"second {i}")
    world.wait(lambda: len(got[other]) == 3, timeout=20, what="the standby taking over")
    assert sorted(got[other]) == [f"second {i}" for i in range(3)] and len(got[holder]) == 6
    assert loops[other].pin_id and loops[other].pin_id != pin
    loops[other].stop()
    threads[other].join(35)
    kinds = [(t, r) for t, _, r in advisories(world)]
    assert kinds == [("consumer_group_pinned", None), ("consumer_group_unpinned", "timeout"),
                     ("consumer_group_pinned", None)]
    s = world.stats("pin")
    assert (s["NumDelivered"], s["NumAckPending"], s["NumPending"]) == (9, 0, 0)


def test_unpin_moves_the_pin_to_the_waiting_standby(world):
    make = pinned(world, timeout=60)
    a, b = make(), make()
    producer = world.producer()
    producer.publish("one")
    a.fetch(batch=1, expires=5)[0].ack()
    pin = a.pin_id
    seen: dict[str, list] = {"a": [], "b": []}
    ta = threading.Thread(target=lambda: seen["a"].extend(a.fetch(batch=1, expires=10)))
    ta.start()
    world.wait(lambda: world.stats("pin")["NumWaiting"] == 1, what="a waiting with its pin")
    tb = threading.Thread(target=lambda: seen["b"].extend(b.fetch(batch=1, expires=10)))
    tb.start()
    world.wait(lambda: world.stats("pin")["NumWaiting"] == 2, what="b waiting")
    answer = b.unpin()
    assert answer["Unpinned"] is True and answer["PreviousPinId"] == pin
    producer.publish("two")
    tb.join(15)
    ta.join(15)
    # a's waiting pull got 423 wrong_pin_id, dropped the id and waited again as a standby; b is pinned
    assert [j.text() for j in seen["b"]] == ["two"] and seen["a"] == []
    assert a.pin_id is None and b.pin_id not in (None, pin)


def test_overflow_thresholds_go_with_every_pull(world):
    world.consumer("ov", token="ovt", priorityPolicy="overflow", priorityGroups=["A"])
    overflow = world.pull_consumer("ov", "ovt", group="A", min_pending=3)
    plain = world.pull_consumer("ov", "ovt", group="A")
    producer = world.producer()
    producer.publish_batch(["1", "2"])
    assert overflow.fetch(batch=5, expires=1) == []  # 2 pending < min_pending 3
    producer.publish("3")
    jobs = overflow.fetch(batch=5, expires=2)
    assert len(jobs) == 1  # served only while pending stays >= 3
    rest = plain.fetch(batch=5, expires=1)
    assert len(rest) == 2
    answers = plain.ack_many([(job, "DELIVERED") for job in jobs + rest])
    assert [a["Status"] for a in answers] == ["DELIVERED"] * 3
    assert world.stats("ov")["NumDelivered"] == 3
