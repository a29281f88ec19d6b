"""Counts of removed rows add up field by field: retention's ``Removed`` and the archive prune's
``PruneCounts`` (its subclass, with what only the prune sees) are one rule."""

from jobs.sweeps.retention import Removed
from pipeline.prune import PruneCounts


def test_removed_adds_every_table():
    total = Removed(1, 2, 3, 4)
    total.add(Removed(10, 20, 30, 40))
    assert (total.messages, total.jobs, total.transitions, total.attempts, total.rows) == (11, 22, 33, 44, 110)


def test_prune_counts_add_their_own_fields_too():
    total = PruneCounts(messages=1, jobs=2, already_gone=1, changed=[7])
    total.add(PruneCounts(messages=2, attempts=5, already_gone=2, changed=[8, 9]))
    assert total.as_dict() == {"messages": 3, "jobs": 2, "transitions": 0, "attempts": 5, "already_gone": 3,
                               "changed": 3}
    assert total.changed == [7, 8, 9]
