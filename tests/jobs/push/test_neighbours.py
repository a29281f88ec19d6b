"""Good neighbours (issue 35 part 3), against real receivers on 127.0.0.1: an endpoint that hangs
takes its fair share of a dispatcher loop's callbacks, opens its connections at a bounded pace and
leaves the rest to a healthy consumer; one that fails at once costs no transaction per failure; a
consumer waiting at its maxInFlight costs no transaction per publish; timeouts open the circuit
from when their attempts began."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from consumers.models import Circuit, CircuitState, Consumer
from tests.helpers import LoopbackServer
from tests.jobs.conftest import Reply

pytestmark = pytest.mark.django_db(transaction=True)


class HangingServer(LoopbackServer):
    """Accepts, reads, never answers; ``accepted`` holds each connection's monotonic time. Closing
    it resets every connection, so the callbacks in flight end at once."""

    def __init__(self) -> None:
        self.accepted: list[float] = []
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        super().__init__()
        self.sock.listen(1024)

    def serve_args(self) -> tuple:
        with self.lock:
            self.accepted.append(time.monotonic())
        return ()

    def serve(self, conn: socket.socket) -> None:
        with self.lock:
            self.open.append(conn)
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass

    def close(self) -> None:
        super().close()
        with self.lock:
            for conn in self.open:
                try:
                    conn.shutdown(socket.SHUT_RDWR)  # wakes the thread in recv(); the client reads the close
                    conn.close()
                except OSError:
                    pass


@pytest.fixture
def hanging():
    server = HangingServer()
    yield server
    server.close()


def test_an_endpoint_that_hangs_gets_its_share_at_a_bounded_pace_and_a_healthy_one_is_delivered(
        make, receiver, dispatcher, hanging, settings):
    """Without fair shares the hanging consumer (maxInFlight 500) fills the loop's 32 callbacks with
    its oldest jobs and the healthy one waits for its timeouts (30 s)."""
    settings.BROKER_PUSH_CONNECT_RATE = 10.0
    make.basics()
    make.consumer("hang", token="hang-token", callback=f"http://127.0.0.1:{hanging.port}/hang", maxInFlight="500",
                  connectionTimeout="30")
    make.consumer("ok", token="ok-token", callback=receiver.url("/ok"))
    for i in range(60):
        assert make.publish(body=b'{"n": %d}' % i).status_code == 201
    started = time.monotonic()
    loop = dispatcher(concurrency=32)
    key = ("http", "127.0.0.1", hanging.port)
    while time.monotonic() - started < 1.0:  # connections to the hanging endpoint: 10 at once, then 10 a second
        opened = loop.engine.client.connects[key]
        assert opened <= 10 + 10 * (time.monotonic() - started) + 1, opened
        time.sleep(0.02)
    receiver.wait(lambda: len(receiver.at("/ok")) >= 60, timeout=10, what="60 deliveries to the healthy consumer")
    time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))  # the hanging one had time for more connections
    share = len(hanging.accepted)
    assert 1 <= share <= 16, share  # half of the loop's 32 at most (it came first: half of what was free)
    assert loop.engine.client.connects[key] == share
    assert loop.engine.inflight == {Consumer.objects.get(consumer_id="hang").pk: share}  # the healthy one: done


def test_an_endpoint_that_fails_at_once_is_not_retried_in_a_tight_loop(make, receiver, dispatcher, settings):
    """A consumer whose circuit counts failures gets one call at a time; its failures wait for the
    loop's window like any other outcome instead of bringing a transaction each (hundreds a
    second before)."""
    settings.BROKER_PUSH_WINDOW = 0.05
    settings.BROKER_RETRY_BACKOFF = [60.0]
    make.basics()
    make.consumer("fail", token="fail-token", callback=receiver.url("/fail"), maxInFlight="500")  # default breaker
    receiver.behave("/fail", lambda n, req: Reply(500))
    for i in range(150):
        assert make.publish(body=b'{"n": %d}' % i).status_code == 201
    loop = dispatcher(concurrency=64)
    receiver.wait(lambda: len(receiver.at("/fail")) >= 20, timeout=10, what="the first failures")
    seconds = 3.0
    calls, transactions = len(receiver.at("/fail")), loop.engine.stats["transactions"]
    time.sleep(seconds)
    calls, transactions = len(receiver.at("/fail")) - calls, loop.engine.stats["transactions"] - transactions
    assert transactions <= seconds / 0.05 + 10, transactions
    assert 1 <= calls <= seconds / 0.05 + 10, calls  # still one call at a time, once per window
    circuit = Circuit.objects.get(consumer__consumer_id="fail")
    assert circuit.state == CircuitState.CLOSED and circuit.failures >= 20  # counting, not open yet (10 s)


def test_a_consumer_waiting_at_its_max_in_flight_costs_no_transaction_per_publish(
        make, dispatcher, hanging, settings):
    settings.BROKER_PUSH_POLL = 30.0  # no safety-net poll during the test: only wake-ups count
    settings.BROKER_PUSH_IDLE_POLL = 30.0
    make.basics()
    make.consumer("hang", token="hang-token", callback=f"http://127.0.0.1:{hanging.port}/hang", maxInFlight="3",
                  connectionTimeout="60")
    for i in range(3):
        assert make.publish(body=b'{"n": %d}' % i).status_code == 201
    loop = dispatcher()
    deadline = time.monotonic() + 10
    while len(hanging.accepted) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(hanging.accepted) == 3
    time.sleep(0.3)
    before = loop.engine.stats["transactions"]
    for i in range(20):  # 20 publishes, each its own NOTIFY (more than BROKER_NOTIFY_INTERVAL apart)
        assert make.publish(body=b'{"n": %d}' % (100 + i)).status_code == 201
        time.sleep(0.1)
    assert loop.engine.stats["transactions"] - before <= 2
    assert len(hanging.accepted) == 3


def test_timeouts_open_the_circuit_from_when_their_attempts_began(make, dispatcher, hanging, settings):
    """Three calls time out after 3 s: they have failed for 3 s, past circuitBreakerOpenAfterSeconds
    (2), so the circuit opens with them (it opened one timeout later, at 6 s and more, when a
    failure counted from its outcome)."""
    make.basics()
    make.consumer("hang", token="hang-token", callback=f"http://127.0.0.1:{hanging.port}/hang", maxInFlight="3",
                  connectionTimeout="3", circuitBreakerFailures="3", circuitBreakerOpenAfterSeconds="2",
                  circuitBreakerProbeSeconds="60", maxRetry="50")
    for i in range(10):
        assert make.publish(body=b'{"n": %d}' % i).status_code == 201
    started = time.monotonic()
    dispatcher()

    def opened():
        row = Circuit.objects.filter(consumer__consumer_id="hang").first()
        return row is not None and row.state in (CircuitState.OPEN, CircuitState.HALF_OPEN)

    deadline = started + 5.0
    while not opened() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert opened(), f"not open {time.monotonic() - started:.1f} s after the first calls"
    assert len(hanging.accepted) <= 3
