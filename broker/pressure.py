"""CPU pressure: the share of the last second in which some task of this machine waited for a CPU.

Read from the kernel's pressure stall information (``/proc/pressure/cpu``, "some" line, Linux 4.20+),
the one figure that says "the machine holds no more" whatever is running on it: the broker's own
processes, its database, a deploy. Publishing's admission (jobs.publish.grouped) tightens when it
is high, so that an offered load the machine cannot carry is refused at once instead of every
delivery falling further behind. Measured on the 2-core bench machine (bench/capacity.py, 1 s
samples): about 0.5-0.65 at the rated 1,000 publishes/s, 0.8-0.95 when offered 3,000/s.

Sampled at most every ``SAMPLE`` seconds (a file read, cheap), over the last ``WINDOW`` seconds;
``None`` where the kernel has no such file (then admission works from the publishing queue alone).
"""

from __future__ import annotations

import threading
import time
from collections import deque

PATH = "/proc/pressure/cpu"
SAMPLE = 0.2  # seconds between two reads of the file
WINDOW = 1.0  # seconds the figure is taken over


def pressure_parse(text: str) -> int | None:
    """The "some" line's cumulative stall microseconds (``total=``), or None."""
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split():
                if field.startswith("total="):
                    try:
                        return int(field[6:])
                    except ValueError:
                        return None
    return None


def pressure_share(samples: deque, *, window: float = WINDOW) -> float | None:
    """The stalled share of the time between the oldest sample within ``window`` of the newest and
    the newest: ``samples`` holds (monotonic seconds, total microseconds), oldest first."""
    if len(samples) < 2:
        return None
    t1, s1 = samples[-1]
    t0, s0 = samples[0]
    for t, s in samples:
        if t1 - t <= window:
            t0, s0 = t, s
            break
    if t1 - t0 <= 0:
        return None
    return max(0.0, min(1.0, (s1 - s0) / 1e6 / (t1 - t0)))


class CpuPressure:
    """The process's sampler: ``share()`` is cheap enough to ask on every publish."""

    def __init__(self, path: str = PATH) -> None:
        self.path = path
        self._samples: deque = deque(maxlen=int(WINDOW / SAMPLE) + 3)
        self._lock = threading.Lock()
        self._next = 0.0
        self._share: float | None = None
        self.available = True

    def share(self) -> float | None:
        now = time.monotonic()
        if now < self._next or not self.available:
            return self._share
        with self._lock:
            if now < self._next:
                return self._share
            self._next = now + SAMPLE
            try:
                with open(self.path, encoding="ascii") as f:
                    total = pressure_parse(f.read())
            except OSError:
                total = None
            if total is None:
                self.available, self._share = False, None
                return None
            self._samples.append((now, total))
            if len(self._samples) >= 2 and now - self._samples[-2][0] > 3 * WINDOW:
                # the first look after a quiet spell: the figure starts from here
                self._samples.clear()
                self._samples.append((now, total))
            self._share = pressure_share(self._samples)
            return self._share


cpu_pressure = CpuPressure()
