"""The one channel between the driver and its trials on the nodes: a small Ray actor on the driver's node.

Trials push their events and progress lines (each push is awaited, so every event of a trial is in the
relay before the trial's task returns); the driver drains them into ``events.jsonl`` — it stays the only
writer. The other way, the driver sets a stop level (1: Ctrl-C, 2: a second Ctrl-C) that each trial
polls. No Ray import: ``driver`` wraps the class with ``ray.remote``.
"""

from __future__ import annotations

from typing import Any

Item = tuple[str, Any]  # ("event", (kind, fields)) | ("say", line)


class Relay:
    def __init__(self) -> None:
        self._items: list[Item] = []
        self._stop = 0

    def push(self, items: list[Item]) -> None:
        self._items.extend(items)

    def drain(self) -> list[Item]:
        items, self._items = self._items, []
        return items

    def set_stop(self, level: int) -> None:
        self._stop = max(self._stop, level)

    def stop_level(self) -> int:
        return self._stop


__all__ = ["Item", "Relay"]
