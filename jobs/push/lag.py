"""How far behind the push deliveries are, as one dispatcher engine sees them: what publishing's
admission sheds load by (jobs.publish.admission; issue 34, "shed, don't drown").

A claimed job waited, once due, until this claim (``PushJob.waited``). Per period each consumer's
longest wait is kept, and the engine's figure is the *shortest* of those: when the broker cannot
keep up (its CPU, its database), every consumer's jobs wait; when one endpoint is slow, down or
failing, only that consumer's do, and its backlog must not refuse the others' publishes (issue 35: a
bad neighbour costs the others nothing). Not counted: consumers paced by ``maxDeliveriesPerSecond``
(behind by their own setting), those whose circuit was counting failures or open when claimed (their
endpoint is the trouble), and those held by their own room (``maxInFlight``: this claim or the one
before took all of it), whose jobs wait for their endpoint's answers, not for the broker; except
while the machine's CPU is starved (broker.pressure at least ``PRESSED`` within the last
``PRESSED_HOLD`` seconds: the shedding itself lowers it), when the answers are slow because the
broker, and on one machine its receivers, get no CPU (measured: offered 6,000/s on 2 cores, the only
push consumer sat at its maxInFlight 50 the whole burst, and leaving it out shed nothing: 44 s
behind again). A consumer with no claim in the period says nothing. The figure is reported
(``push_owner_lag``) once a period (``PERIOD``) while it or the last reported one is not zero (under
``QUIET`` counts as zero): nothing is written while all is well.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.pressure import cpu_pressure
from jobs.push.claim import PushJob

PERIOD = 0.5  # seconds between two figures
QUIET = 0.25  # seconds: a figure under this is reported as 0 (a broker keeping up writes nothing)
PRESSED = 0.75  # CPU pressure (broker.pressure): 0.5-0.65 at the rated 1,000/s, 0.8-0.95 when overloaded
PRESSED_HOLD = 10.0  # seconds held consumers still count after the pressure was last that high (shedding lowers it)


class DeliveryLag:
    """One engine's figure, period by period (used by its coordinator thread only)."""

    def __init__(self) -> None:
        self._worst: dict[int, float] = {}  # consumer pk: its longest wait this period
        self._since: float | None = None  # when this period began
        self.reported = 0.0  # the last figure written
        self._pressed_until = float("-inf")  # consumers held by their room count until then

    def observe(self, jobs: list[PushJob], *, targets: Mapping, saturated: set[int], now: float) -> None:
        """The jobs of one claim; ``targets``: the consumers' delivery settings by pk (``rate``: paced);
        ``saturated``: the consumers whose claim before this one took all of their room."""
        if self._since is None:
            self._since = now
        claimed: dict[int, int] = {}
        for job in jobs:
            claimed[job.consumer_pk] = claimed.get(job.consumer_pk, 0) + 1
        pressure = cpu_pressure.share() if jobs else None
        if pressure is not None and pressure >= PRESSED:
            self._pressed_until = now + PRESSED_HOLD
        held_count = now < self._pressed_until  # a starved machine slows every answer
        worst = self._worst
        for job in jobs:
            pk = job.consumer_pk
            if job.waited is None or job.circuit_dirty:
                continue
            if not held_count and (pk in saturated or (job.room is not None and claimed[pk] >= job.room)):
                continue  # held by its room (this claim or the one before took all of it): its endpoint's pace
            target = targets.get(pk)
            if target is not None and target.rate:
                continue
            if job.waited > worst.get(pk, -1.0):
                worst[pk] = job.waited

    def due(self, now: float) -> float | None:
        """The period's figure once it is over and worth writing (else None); a new period begins."""
        if self._since is None:
            self._since = now
            return None
        if now - self._since < PERIOD:
            return None
        figure = lag_figure(self._worst)
        if figure < QUIET:
            figure = 0.0
        self._worst, self._since = {}, now
        if figure == 0.0 and self.reported == 0.0:
            return None
        return figure

    def written(self, figure: float) -> None:
        self.reported = figure


def lag_figure(worst: dict[int, float]) -> float:
    """The shortest of the consumers' longest waits (seconds, 0 when none claimed), rounded to ms."""
    return round(max(0.0, min(worst.values())), 3) if worst else 0.0
