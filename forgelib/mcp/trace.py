"""A trial's ``trace.jsonl``: one JSON object per tool call, appended and flushed as each call ends.

A record (field names are the contract with grading)::

    {"seq": 1, "tool": "sql_query", "arguments": {...}, "started": 1764646800.12, "ended": 1764646800.13,
     "ok": true, "result": "<text the agent received, at most RESULT_LIMIT bytes>", "error": null,
     "result_bytes": 412, "result_sha256": "<hex of the whole result>", "truncated": false}

An error: ``"ok": false, "result": null, "error": "<message>"`` (``result_bytes`` 0, the sha256 of "").
``seq`` counts from 1 in the order calls *ended*, which is the order of the lines in the file (``started``
says when each began). Each record is one ``os.write`` of one line on a file opened for appending, so a
crash or kill of forge loses no call that had ended; ``fsync`` additionally survives a power loss.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RESULT_LIMIT = 16 * 1024  # bytes of a result kept in the trace (UTF-8); the sha256 covers the whole


def truncate_utf8(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` UTF-8 bytes without splitting a character, and whether it was cut."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text, False
    return raw[:limit].decode("utf-8", "ignore"), True


def record(
    seq: int,
    tool: str,
    arguments: Mapping[str, Any],
    started: float,
    ended: float,
    *,
    result: str | None,
    error: str | None,
    limit: int = RESULT_LIMIT,
) -> dict[str, Any]:
    """One trace record; exactly one of ``result`` / ``error`` is not None."""
    whole = (result or "").encode("utf-8", "surrogatepass")
    kept, truncated = truncate_utf8(result, limit) if result is not None else (None, False)
    return {
        "seq": seq,
        "tool": tool,
        "arguments": dict(arguments),
        "started": started,
        "ended": ended,
        "ok": error is None,
        "result": kept,
        "error": error,
        "result_bytes": len(whole),
        "result_sha256": hashlib.sha256(whole).hexdigest(),
        "truncated": truncated,
    }


class TraceWriter:
    """Appends records to one trace file; thread-safe (the server runs tools on worker threads)."""

    def __init__(self, path: Path, *, fsync: bool = False, limit: int = RESULT_LIMIT) -> None:
        self.path = path
        self._fsync = fsync
        self._limit = limit
        self._lock = threading.Lock()
        self._seq = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND: every write lands at the end, whole, even if another writer shared the file.
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @property
    def calls(self) -> int:
        return self._seq

    def write(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        started: float,
        ended: float,
        *,
        result: str | None = None,
        error: str | None = None,
    ) -> dict[str, Any]:
        """Record one ended call (its ``seq`` is the next number) and return the record."""
        with self._lock:
            if self._fd is None:
                raise ValueError(f"trace {self.path} is closed")
            self._seq += 1
            rec = record(
                self._seq, tool, arguments, started, ended, result=result, error=error, limit=self._limit
            )
            line = (json.dumps(rec, ensure_ascii=False, default=str) + "\n").encode("utf-8", "surrogatepass")
            view = memoryview(line)
            while view:  # a regular file takes it in one write; a short write is finished, not dropped
                view = view[os.write(self._fd, view) :]
            if self._fsync:
                os.fsync(self._fd)
            return rec

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class BadRecord(ValueError):
    """A line of a trace that is not a record (and not the torn last line)."""

    def __init__(self, name: str, line: int, why: str) -> None:
        super().__init__(f"{name}:{line}: {why}")
        self.line, self.why = line, why


def parse_records(raw: bytes, name: str) -> tuple[list[tuple[int, dict[str, Any]]], bool]:
    """Each record of a trace with its line number, and whether a torn last line (forge killed mid-write:
    no newline after it) was left out. A bad line anywhere else raises ``BadRecord`` naming ``name``."""
    lines = raw.split(b"\n")
    out: list[tuple[int, dict[str, Any]]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            if i == len(lines):  # no newline after it: the write that was cut short
                return out, True
            raise BadRecord(name, i, f"not a JSON trace record: {line[:80]!r}") from None
        if not isinstance(value, dict):
            raise BadRecord(name, i, f"a trace record is a JSON object, not {type(value).__name__}")
        out.append((i, value))
    return out, False


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The records of a trace file, in file order (``parse_records``). A missing file reads as no trace:
    []; a bad line other than a torn last one raises ``BadRecord`` (a ValueError) naming the file and line."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    return [record for _, record in parse_records(raw, str(path))[0]]
