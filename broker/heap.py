"""The garbage collector in a serving process (the web workers' event loops, the qcluster workers'
dispatcher loops).

CPython's full collection (its oldest generation) walks every container object the process holds,
and a worker holds about 100,000 from the start that it keeps for its life: Django, the URL conf,
DRF, the routes, the tasks, the caches (`make run`'s workers log 103,000-108,000 frozen; a full pass
at an overload walked 146,000-181,000 with what the requests had allocated). Every full pass walked
them all again, and the pass stops the
whole process, event loop included: at a 6,000/s overload the two workers paused 24 times between
them in two and a half minutes, 0.05-0.35 s each (median 0.13), and every publish waiting on that
loop waited that much longer.
``gc.freeze`` (Python 3.7+) moves the objects alive at that moment to a permanent generation the
collector no longer walks; what the process allocates later is collected as before. The frozen
objects are never freed (they are alive for the process's life anyway).
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)


def heap_freeze() -> int:
    """(a serving process, once it has loaded what it serves with) Collect what is garbage now,
    then freeze the rest out of later full passes; returns the objects frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("%d objects frozen out of the garbage collector's full passes (BROKER_GC_FREEZE)", frozen)
    return frozen
