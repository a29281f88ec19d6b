"""Cost at a growing backlog: every hot path at 10k, 100k and 1M queued jobs, and the 1M / 10k ratios.

The backlog is built as a user would meet it: batch publishing over HTTP (1,000 messages a request,
4 concurrent publishers) to one channel with a pull consumer, two priority-group pull consumers
(pinned_client, overflow) and 5 push consumers (all holding the backlog), and a second channel
whose pull consumer's jobs are spread over 10,000 partitions; measured right after it was built
(no ANALYZE or VACUUM by hand), then the pull paths again after ANALYZE. Fixed besides: a DLQ of
100,000 dead jobs and 100,000 in-flight jobs whose deadline passes, for the timeout sweep.

Then the settle phase, at the largest size: what a user lives through next. It waits for
autovacuum's analyze of ``jobs_job`` (or runs ANALYZE itself after --settle-wait, 4 minutes) and
measures every figure again, on the statistics production really has (one pull consumer owning
most of the table); the ratio of those to the smallest size must hold too (issue 21).

At each size, the median of --samples requests (one client, keep-alive) of: a single broadcast;
pull 100 + ack 100; the spec path (GET queued-jobs?limit=25, POST job INFLIGHT, POST job
DELIVERED); an ack with NextState QUEUED and a Delay; progress; consumer GET; messages-status;
/metrics; the admin dashboard and job list (staff session); the DLQ list; a priority-group pull +
ack (pinned_client, overflow); a partitioned pull + ack; then push deliveries/s to the 5 push
consumers (a fast loopback receiver, for --push-seconds), and the time the timeout sweep
(jobs.sweeps.inflight_timeout.jobs_expire_inflight, as the workers call it) takes to requeue the 100,000 expired jobs,
with pull + ack latency meanwhile. Then the EXPLAIN (ANALYZE, BUFFERS) of the pull claim at the
largest size (and of another jobs/state.py's with --before-state, e.g. ``git show main:jobs/state.py``).

    .venv/bin/python bench/growth.py [--sizes 10000,100000,1000000] [--samples 21]
    .venv/bin/python bench/growth.py --smoke        # tiny sizes, a few seconds: the table, exit 0

Targets (2-core machine): every ratio 1M/10k <= 1.5, also settled (push deliveries/s at 1M >= 2/3 of 10k);
pull 100 + ack 100 at 1M <= 40 ms; 100k expired in-flight jobs swept in <= 5 s without blocking
pulls. Uses DATABASE_URL when set (a throw-away database), else an embedded PostgreSQL (fsync on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402

from bench.common import (ADMIN, _read_response, base_env, broker_database, build_request, manage,  # noqa: E402
                          start_gunicorn)

PAYLOAD = json.dumps({"event": "order.created", "id": 12345, "items": [1, 2, 3], "note": "x" * 200})
PUBLISH = {"X-Broker-Channel-Token": "ct", "X-Broker-Producer-ID": "growth", "X-Broker-Producer-Token": "pt"}
TOKENS = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "t"}
PUSH_CONSUMERS = 5
PARTITIONS = 10_000
STAFF = ("growth-admin", "growth-admin-password")


class Failure(Exception):
    pass


def check(response, *codes):
    if response.status_code not in codes:
        raise Failure(f"{response.request.method} {response.request.url}: {response.status_code} {response.text[:300]}")
    return response


# --- building -------------------------------------------------------------------------------------

def setup(url: str, receiver_port: int, sweep_size: int) -> None:
    s = requests.Session()
    s.headers["X-Broker-Admin-Token"] = ADMIN
    check(s.put(f"{url}/producer/growth", data={"token": "pt"}), 201, 200)
    for channel in ("growth", "parts", "deadch", "sweeps"):
        check(s.put(f"{url}/channel/{channel}", data={"token": "ct"}), 201, 200)
    pull = {"token": "t", "type": "pull"}
    check(s.put(f"{url}/channel/growth/consumer/pull", data=pull), 201, 200)
    check(s.put(f"{url}/channel/growth/consumer/pinned",
                data={**pull, "priorityPolicy": "pinned_client", "priorityGroups": "A",
                      "priorityTimeout": "3600"}), 201, 200)  # the pin outlives building the next size
    check(s.put(f"{url}/channel/growth/consumer/overflow",
                data={**pull, "priorityPolicy": "overflow", "priorityGroups": "A"}), 201, 200)
    for i in range(PUSH_CONSUMERS):
        check(s.put(f"{url}/channel/growth/consumer/push{i}",
                    data={"token": "t", "callbackUrl": f"http://127.0.0.1:{receiver_port}/push{i}",
                          "maxInFlight": "100"}), 201, 200)
    check(s.put(f"{url}/channel/parts/consumer/parted", data=pull), 201, 200)
    check(s.put(f"{url}/channel/deadch/consumer/dlq", data={**pull, "maxAckPending": str(sweep_size * 2)}), 201, 200)
    check(s.put(f"{url}/channel/sweeps/consumer/sweep", data={**pull, "maxAckPending": str(sweep_size * 2)}), 201, 200)


def publish(url: str, channel: str, n: int, *, start: int = 0, partitions: int = 0, publishers: int = 4,
            batch: int = 1000) -> float:
    """n messages over HTTP, ``batch`` a request, ``publishers`` at once. Returns seconds."""
    host, port = url.split("//")[1].split(":")
    starts = iter(range(start, start + n, batch))

    def body(first: int) -> bytes:
        items = []
        for i in range(first, min(first + batch, start + n)):
            item = {"Payload": PAYLOAD, "ContentType": "application/json"}
            if partitions:
                item["PartitionKey"] = f"k{i % partitions}"
            items.append(item)
        return json.dumps(items).encode()

    async def worker():
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for first in starts:
                writer.write(build_request("POST", f"/channel/{channel}/messages",
                                           {**PUBLISH, "Content-Type": "application/json"}, body(first)))
                status, _, data = await _read_response(reader)
                if status != 201:
                    raise Failure(f"publish to {channel}: {status} {data[:200]!r}")
        finally:
            writer.close()

    async def main():
        await asyncio.gather(*(worker() for _ in range(publishers)))

    t0 = time.perf_counter()
    asyncio.run(main())
    return time.perf_counter() - t0


def pull_all(s: requests.Session, url: str, path: str, *, then: str | None, inc=None, batch: int = 1000,
             limit: int | None = None) -> int:
    """Claim every due job of a consumer (batch pulls; at most ``limit``); ``then``: ack them with
    that NextState."""
    total = 0
    while limit is None or total < limit:
        body = {"batch": batch if limit is None else min(batch, limit - total)}
        if inc is not None:
            body["IncrementalTimeout"] = inc() if callable(inc) else inc
        jobs = check(s.post(f"{url}{path}/pull", json=body, headers=TOKENS), 200).json()["Result"]
        if not jobs:
            return total
        total += len(jobs)
        if then:
            check(s.post(f"{url}{path}/ack", json={"Jobs": [{"ID": j["ID"], "NextState": then} for j in jobs]},
                         headers=TOKENS), 200)


# --- in-process Django (the sweep, the staff user, counters, EXPLAIN) -------------------------------

def django_setup(env: dict) -> None:
    for key in ("DATABASE_URL", "DJANGO_SECRET_KEY", "BROKER_ADMIN_TOKEN", "BROKER_CONNECTION_TIMEOUT",
                "BROKER_RATIONAL_DELAY", "BROKER_LOG_LEVEL"):
        if key in env:
            os.environ[key] = env[key]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    import django

    django.setup()


def staff_session(url: str) -> requests.Session:
    from django.contrib.auth import get_user_model

    User = get_user_model()
    if not User.objects.filter(username=STAFF[0]).exists():
        User.objects.create_superuser(STAFF[0], "growth@example.invalid", STAFF[1])
    s = requests.Session()
    check(s.get(f"{url}/admin/login/"), 200)
    check(s.post(f"{url}/admin/login/", data={"username": STAFF[0], "password": STAFF[1], "next": "/admin/",
                                               "csrfmiddlewaretoken": s.cookies["csrftoken"]},
                 headers={"Referer": f"{url}/admin/login/"}), 200)
    if "sessionid" not in s.cookies:
        raise Failure("admin login failed")
    return s


def counters_fold() -> None:
    """What the workers do every few seconds (they are not running while the backlog is built)."""
    from django.db import connection

    from broker.counters import counters_compact

    counters_compact()
    connection.close()


class Compactor(threading.Thread):
    """Folds the counter deltas every 5 s while measuring, as the workers' loops do
    (COMPACT_EVERY): they are not running here except for the push phase."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(5.0):
            counters_fold()


def autovacuum_now() -> str:
    """What autovacuum is doing right now (it competes for the 2 cores right after a big backlog)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT coalesce(string_agg(regexp_replace(query, '^autovacuum: ', ''), '; '), 'idle') "
                    "FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'")
        return cur.fetchone()[0]


def jobs_analyzed_at():
    """When jobs_job was last analyzed by autovacuum (None: never)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT last_autoanalyze FROM pg_stat_user_tables WHERE relname = 'jobs_job'")
        row = cur.fetchone()
    return row[0] if row else None


def settle(built_after, wait: float) -> str:
    """Wait for autovacuum's analyze of jobs_job after ``built_after`` (the largest backlog was
    built); after ``wait`` seconds without one, ANALYZE it here. Says which happened."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait:
        at = jobs_analyzed_at()
        if at is not None and at > built_after:
            return f"autovacuum analyzed jobs_job {time.monotonic() - t0:.0f} s into the wait"
        time.sleep(2.0)
    analyze()
    return f"no autovacuum analyze of jobs_job within {wait:.0f} s: ANALYZE run by the benchmark"


def db_now():
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]


def analyze() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        for table in ("jobs_job", "broker_message", "jobs_partition", "broker_counterdelta"):
            cur.execute(f"ANALYZE {table}")


def consumer_pk(channel: str, consumer: str) -> int:
    from consumers.models import Consumer

    return Consumer.objects.get(channel__channel_id=channel, consumer_id=consumer).pk


def explain_claim(sql: str, consumer: int) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of a pull claim statement (100 jobs) as its prepared generic plan
    (what runs), in a transaction that is rolled back."""
    import re

    from django.db import connection, transaction

    from jobs.state import floors

    names: list[str] = []

    def number(m):
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, sql)
    values = {"consumer": consumer, "limit": 100, "max_bytes": None, "queued": 1001, "inflight": 1002,
              "timeout": 32.25, "inc": None, "reason": "explain",
              "fp": floors.FULL[0], "fi": floors.FULL[1], "rsince": None, "lag": floors.LAG}  # a full walk
    args = ", ".join("NULL" if values[n] is None else repr(values[n]) if not isinstance(values[n], str)
                     else f"'{values[n]}'" for n in names)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute(f"PREPARE growth_claim AS {text}")
        try:
            cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE growth_claim({args})")
            plan = "\n".join(r[0] for r in cur.fetchall())
        finally:
            cur.execute("DEALLOCATE growth_claim")
        transaction.set_rollback(True)
    return plan


# --- measuring ---------------------------------------------------------------------------------------

def median_ms(fn, samples: int) -> float:
    times = []
    for _ in range(samples):
        times.append(fn())
    return statistics.median(times) * 1000


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Client:
    def __init__(self, url: str, staff: requests.Session):
        self.url = url
        self.s = requests.Session()
        self.staff = staff
        self.pins: dict[str, str] = {}

    def get(self, path, headers=None, session=None):
        return check((session or self.s).get(f"{self.url}{path}", headers=headers or {}), 200)

    def post(self, path, body, headers=None, *codes):
        return check(self.s.post(f"{self.url}{path}", json=body, headers=headers or TOKENS), *(codes or (200,)))

    def pull_ack(self, path: str, batch: int = 100, **extra) -> float:
        def run():
            body = {"batch": batch, **extra}
            if path.endswith("pinned") and path in self.pins:
                body["id"] = self.pins[path]
            r = self.post(f"{path}/pull", body)
            data = r.json()
            if data.get("PinId"):
                self.pins[path] = data["PinId"]
            jobs = data["Result"]
            if not jobs:
                raise Failure(f"{path}: pull returned no job ({body}: {r.status_code} {r.text[:200]})")
            self.post(f"{path}/ack", {"Jobs": [{"ID": j["ID"], "NextState": "DELIVERED"} for j in jobs]})
        return timed(run)

    def one_inflight(self, path: str) -> str:
        jobs = self.post(f"{path}/pull", {"batch": 1}).json()["Result"]
        if not jobs:
            raise Failure(f"{path}: no job to pull")
        return jobs[0]["ID"]


def c_pending(url: str, channel: str, consumer: str) -> int:
    r = check(requests.get(f"{url}/channel/{channel}/consumer/{consumer}", headers={"X-Broker-Admin-Token": ADMIN}),
              200)
    return int(r.json()["NumPending"])


def measure_size(c: Client, samples: int) -> dict[str, float]:
    base = "/channel/growth/consumer/pull"
    out: dict[str, float] = {}

    def broadcast():
        r = c.s.post(f"{c.url}/channel/growth/broadcast", data=PAYLOAD,
                     headers={**PUBLISH, "Content-Type": "application/json"})
        check(r, 201)

    out["broadcast (single message)"] = median_ms(lambda: timed(broadcast), samples)
    out["pull 100 + ack 100"] = median_ms(lambda: c.pull_ack(base), samples)

    spec = {"list": [], "inflight": [], "delivered": []}
    for _ in range(samples):
        t0 = time.perf_counter()
        jobs = c.get(f"{base}/queued-jobs?limit=25", TOKENS).json()["Result"]
        spec["list"].append(time.perf_counter() - t0)
        job = jobs[0]["ID"]
        spec["inflight"].append(timed(lambda: c.post(f"{base}/job/{job}", {"NextState": "INFLIGHT"}, TOKENS, 202)))
        spec["delivered"].append(timed(lambda: c.post(f"{base}/job/{job}", {"NextState": "DELIVERED"}, TOKENS, 202)))
    out["spec: GET queued-jobs?limit=25"] = statistics.median(spec["list"]) * 1000
    out["spec: POST job INFLIGHT"] = statistics.median(spec["inflight"]) * 1000
    out["spec: POST job DELIVERED"] = statistics.median(spec["delivered"]) * 1000

    def nack():
        job = c.one_inflight(base)
        return timed(lambda: c.post(f"{base}/ack", {"Jobs": [{"ID": job, "NextState": "QUEUED", "Delay": 5}]}))

    out["ack NextState QUEUED + Delay"] = median_ms(nack, samples)

    def progress():
        job = c.one_inflight(base)
        t = timed(lambda: c.post(f"{base}/job/{job}/progress", {"IncrementalTimeout": 30}))
        c.post(f"{base}/ack", {"Jobs": [{"ID": job, "NextState": "DELIVERED"}]})
        return t

    out["progress"] = median_ms(progress, samples)
    out["consumer GET (statistics)"] = median_ms(lambda: timed(lambda: c.get(base, TOKENS)), samples)
    out["messages-status"] = median_ms(lambda: timed(lambda: c.get("/channel/growth/messages-status",
                                                                    {"X-Broker-Admin-Token": ADMIN})), samples)
    out["/metrics"] = median_ms(lambda: timed(lambda: c.get("/metrics")), samples)
    out["admin dashboard"] = median_ms(lambda: timed(lambda: c.get("/admin/", session=c.staff)), samples)
    out["admin job list"] = median_ms(lambda: timed(lambda: c.get("/admin/jobs/job/", session=c.staff)), samples)
    out["DLQ list (100k dead)"] = median_ms(
        lambda: timed(lambda: c.get("/channel/deadch/consumer/dlq/dlq", TOKENS)), samples)
    out["priority group pull 100 + ack: pinned_client"] = median_ms(
        lambda: c.pull_ack("/channel/growth/consumer/pinned", group="A", no_wait=True), samples)
    out["priority group pull 100 + ack: overflow"] = median_ms(
        lambda: c.pull_ack("/channel/growth/consumer/overflow", group="A", no_wait=True, min_pending=1), samples)
    out["partitioned pull 100 + ack (10k partitions)"] = median_ms(
        lambda: c.pull_ack("/channel/parts/consumer/parted"), samples)
    return out


def measure_analyzed(c: Client, samples: int) -> dict[str, float]:
    base = "/channel/growth/consumer/pull"
    print(f"autovacuum before the ANALYZE: {autovacuum_now()}", flush=True)
    analyze()
    return {
        "after ANALYZE: pull 100 + ack 100": median_ms(lambda: c.pull_ack(base), samples),
        "after ANALYZE: GET queued-jobs?limit=25": median_ms(
            lambda: timed(lambda: c.get(f"{base}/queued-jobs?limit=25", TOKENS)), samples),
    }


# --- push deliveries -------------------------------------------------------------------------------------

def push_rate(env: dict, receiver, seconds: float, workdir: Path) -> float:
    """Deliveries/s to the push consumers with the workers running (started here, stopped after)."""
    from bench.push import _kill, _spawn

    workers = _spawn([sys.executable, "manage.py", "qcluster"], env, workdir / "qcluster.log")
    try:
        deadline = time.monotonic() + 60
        receiver.ask("reset")
        while receiver.ask("count") < 200:  # started and warm
            if time.monotonic() > deadline or workers.poll() is not None:
                raise Failure("push deliveries did not start: " + (workdir / "qcluster.log").read_text()[-1500:])
            time.sleep(0.2)
        first = receiver.ask("count")
        t0 = time.monotonic()
        time.sleep(seconds)
        return (receiver.ask("count") - first) / (time.monotonic() - t0)
    finally:
        _kill(workers)


# --- the timeout sweep -----------------------------------------------------------------------------------

def sweep_phase(url: str, sweep_size: int, base_wait: float) -> dict[str, float]:
    """Claim the sweep consumer's jobs so that their deadlines all pass at about the same time,
    wait for that, then time the sweep (as the workers call it) while pulling on another consumer."""
    from django.db import connection

    from jobs.sweeps.inflight_timeout import jobs_expire_inflight

    s = requests.Session()
    path = "/channel/sweeps/consumer/sweep"
    expire_at = time.monotonic() + base_wait
    timeout = float(os.environ.get("BROKER_CONNECTION_TIMEOUT", "30")) + 0.25 + float(
        os.environ.get("BROKER_RATIONAL_DELAY", "2"))
    pull_all(s, url, path, then=None, inc=lambda: max(1, round(expire_at - time.monotonic() - timeout)),
             limit=sweep_size)
    pk = consumer_pk("sweeps", "sweep")
    with connection.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM max(deadline) - now()) FROM jobs_job WHERE consumer_id = %s "
                    "AND status = 1002", [pk])
        wait = float(cur.fetchone()[0] or 0) + 0.2
    time.sleep(max(wait, 0))
    pulls: list[float] = []
    stop = threading.Event()
    client = Client(url, None)

    def puller():  # a steady consumer: a pull + ack every 0.2 s
        while not stop.is_set():
            pulls.append(client.pull_ack("/channel/growth/consumer/pull"))
            stop.wait(0.2)

    thread = threading.Thread(target=puller)
    thread.start()
    time.sleep(0.5)
    before = list(pulls)
    t0 = time.perf_counter()
    moved = 0
    while True:
        n = jobs_expire_inflight()  # what each worker sweep calls (every second)
        moved += n
        if n == 0:
            break
    elapsed = time.perf_counter() - t0
    during = pulls[len(before):]
    stop.set()
    thread.join()
    connection.close()
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM jobs_job WHERE consumer_id = %s AND status = 1002", [pk])
        left = cur.fetchone()[0]
    if left or moved < sweep_size * 0.9:  # (a slow claim lets the pulls' own lazy sweep take a few first)
        raise Failure(f"the sweep moved {moved} expired jobs of about {sweep_size}; {left} still in flight")
    return {"sweep s": elapsed, "moved": moved,
            "pull ms during sweep (median)": statistics.median(during) * 1000 if during else float("nan"),
            "pull ms during sweep (max)": max(during) * 1000 if during else float("nan"),
            "pulls during sweep": len(during)}


# --- main --------------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--samples", type=int, default=21)
    parser.add_argument("--dead", type=int, default=100_000, help="dead jobs in the DLQ")
    parser.add_argument("--sweep", type=int, default=100_000, help="expired in-flight jobs to sweep")
    parser.add_argument("--push-seconds", type=float, default=10.0)
    parser.add_argument("--before-state", help="a jobs/state.py (e.g. from git show main:jobs/state.py) whose pull "
                                               "claim is EXPLAINed next to this one's at the largest size")
    parser.add_argument("--settle-wait", type=float, default=240.0,
                        help="seconds to wait for autovacuum's analyze of jobs_job before running ANALYZE")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: print the table, exit 0")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.samples, args.dead, args.sweep, args.push_seconds = "1000,2000", 3, 200, 300, 1.0
        args.settle_wait = min(args.settle_wait, 3.0)  # smoke: the ANALYZE path, not a wait
    sizes = [int(x) for x in args.sizes.split(",")]
    load_before = os.getloadavg()
    import tempfile

    from bench.push import Receiver

    workdir = Path(tempfile.mkdtemp(prefix="bench-growth-"))
    receiver = Receiver()
    results: dict[int | str, dict[str, float]] = {}
    sweeps: dict[int | str, dict] = {}
    settled = ""
    plans: list[tuple[str, str]] = []
    try:
        with broker_database() as database_url:
            # short in-flight deadlines (2 s + IncrementalTimeout) so the sweep set expires soon
            env = base_env(database_url, BROKER_CONNECTION_TIMEOUT="2", BROKER_RATIONAL_DELAY="0",
                           BROKER_SECURE_COOKIES="0")  # the staff session over plain loopback HTTP
            manage(env, "migrate", "--verbosity", "0")
            django_setup(env)
            server = start_gunicorn(env, workers=2)
            try:
                url = server.url
                setup(url, receiver.port, args.sweep)
                staff = staff_session(url)
                s = requests.Session()
                t = publish(url, "deadch", args.dead)
                pull_all(s, url, "/channel/deadch/consumer/dlq", then="DEAD")
                publish(url, "sweeps", args.sweep)
                print(f"built: {args.dead} dead jobs, {args.sweep} jobs for the sweep ({t:.0f} s for the dead ones)",
                      flush=True)
                published = {"growth": 0, "parts": 0}
                c = Client(url, staff)  # one client: the pinned_client pulls carry their pin id across sizes
                for size in sizes:
                    t0 = time.perf_counter()
                    built_after = None
                    counters_fold()
                    for channel, consumer in (("growth", "pull"), ("parts", "parted")):
                        # up to ``size`` queued jobs (measuring the previous size consumed some)
                        pending = min(c_pending(url, channel, consumer), size)
                        publish(url, channel, size - pending, start=published[channel],
                                partitions=PARTITIONS if channel == "parts" else 0)
                        published[channel] += size - pending
                    counters_fold()
                    built_after = db_now()
                    print(f"backlog {size:,}: built in {time.perf_counter() - t0:.0f} s "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
                    compactor = Compactor()
                    compactor.start()
                    print(f"backlog {size:,}: autovacuum at the start of measuring: {autovacuum_now()}", flush=True)
                    results[size] = measure_size(c, args.samples)
                    results[size]["push deliveries/s (5 consumers)"] = push_rate(env, receiver, args.push_seconds,
                                                                                 workdir)
                    sweeps[size] = sweep_phase(url, args.sweep, base_wait=max(4.0 if args.smoke else 10.0, args.sweep / 2500))
                    results[size]["timeout sweep of the expired in-flight jobs (ms)"] = sweeps[size]["sweep s"] * 1000
                    if size == sizes[-1]:
                        # the settle phase: statistics as autovacuum leaves them at the largest backlog
                        settled = settle(built_after, args.settle_wait)
                        print(f"backlog {size:,}: settle phase: {settled}", flush=True)
                        results["settled"] = measure_size(c, args.samples)
                        results["settled"]["push deliveries/s (5 consumers)"] = push_rate(
                            env, receiver, args.push_seconds, workdir)
                        sweeps["settled"] = sweep_phase(url, args.sweep, base_wait=max(
                            4.0 if args.smoke else 10.0, args.sweep / 2500))
                        results["settled"]["timeout sweep of the expired in-flight jobs (ms)"] = \
                            sweeps["settled"]["sweep s"] * 1000
                    results[size].update(measure_analyzed(c, args.samples))
                    if size == sizes[-1]:
                        results["settled"].update({k: results[size][k] for k in results[size] if k.startswith("after")})
                    compactor.stop.set()
                    compactor.join()
                    counters_fold()
                    print(f"backlog {size:,}: measured (load {os.getloadavg()[0]:.1f}): "
                          + json.dumps({k: round(v, 2) for k, v in results[size].items()}), flush=True)
                from jobs.pull.queries import Q

                pk = consumer_pk("growth", "pull")
                plans.append(("this jobs/pull/queries.sql", explain_claim(Q.claim_pull.sql, pk)))
                if args.before_state:
                    import importlib.util

                    spec = importlib.util.spec_from_file_location("before_state", args.before_state)
                    before = importlib.util.module_from_spec(spec)
                    sys.modules["before_state"] = before  # (its dataclasses look their module up)
                    try:
                        spec.loader.exec_module(before)
                        # a jobs/state.py from before the named-query registry (now jobs/*/queries.sql)
                        plans.append((args.before_state, explain_claim(before._CLAIM_SQL_TYPED, pk)))
                    except Exception as exc:  # noqa: BLE001 - the table above is the result; say why not
                        plans.append((args.before_state, f"not explained: {exc!r}"))
            finally:
                server.stop()
    finally:
        receiver.stop()
    report(sizes, results, sweeps, plans, load_before, args, settled)
    return 0


# bench/common.py's smoke convention: what the printed table must match (tests/system/bench)
SMOKE_TABLE = (r"^bench/growth\.py: median of \d+ requests .*\n(?s:.*)"
               r"^pull 100 \+ ack 100 +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+(  <-)?$"  # <-: a ratio off target
               r"(?s:.*)^settle phase: .*$(?s:.*)^targets: ratios <= 1\.5 ")


def report(sizes, results, sweeps, plans, load_before, args, settled: str = "") -> None:
    first, last = sizes[0], sizes[-1]
    print()
    print(f"bench/growth.py: median of {args.samples} requests (ms; push: deliveries/s; sweep: "
          f"{args.sweep:,} expired jobs, ms), load average before {load_before[0]:.1f} {load_before[1]:.1f} "
          f"{load_before[2]:.1f}, after {os.getloadavg()[0]:.1f}")
    names = list(results[first])
    columns = [*sizes, "settled"]
    width = max(len(n) for n in names) + 2
    print(f"{'':{width}}" + "".join(f"{s:>12,}" for s in sizes) + f"{'settled':>12}{'ratio':>9}{'settled':>9}")
    for name in names:
        values = [results[s].get(name, float("nan")) for s in columns]
        ratios = [v / values[0] if values[0] else float("nan") for v in (values[-2], values[-1])]
        push = name.startswith("push")
        bad = any((r < 2 / 3) if push else (r > 1.5) for r in ratios)
        print(f"{name:{width}}" + "".join(f"{v:12.1f}" for v in values) + "".join(f"{r:9.2f}" for r in ratios)
              + ("  <-" if bad else ""))
    print(f"(settled: at {last:,} again, after the statistics settled; ratio: {last:,} / {first:,} and "
          f"settled / {first:,})")
    for size in columns:
        sw = sweeps[size]
        print(f"sweep at {size if isinstance(size, str) else f'{size:,}'}: {sw['moved']:,} jobs in {sw['sweep s']:.2f} s; "
              f"{sw['pulls during sweep']} pull 100 + ack 100 meanwhile, median {sw['pull ms during sweep (median)']:.1f} ms, "
              f"max {sw['pull ms during sweep (max)']:.1f} ms")
    print(f"settle phase: {settled}")
    pull_ms = max(results[last]["pull 100 + ack 100"], results["settled"]["pull 100 + ack 100"])
    sweep_s = max(sweeps[last]["sweep s"], sweeps["settled"]["sweep s"])
    print(f"targets: ratios <= 1.5 (push >= 2/3), in both phases; pull 100 + ack 100 at {last:,}: {pull_ms:.1f} ms "
          f"(<= 40); sweep {sweeps[last]['moved']:,} in {sweep_s:.2f} s (<= 5)")
    for label, plan in plans:
        print(f"\nEXPLAIN (ANALYZE, BUFFERS) of the pull claim (100 jobs, generic plan) at {last:,}, {label}:")
        print(plan)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as exc:
        print(f"growth benchmark failed: {exc}", file=sys.stderr)
        sys.exit(1)
