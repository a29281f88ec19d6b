"""Advisories: broker events about consumers (priority-group pins, partitions complete or failed,
circuits, replays), recorded and optionally published to a channel."""
