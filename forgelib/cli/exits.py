"""The one place a command's errors become exit codes (0 ok, 1 user error, 2 usage, 130 interrupted, 3
unexpected — with the log's path), and the debug log every command appends to. ``tasks.py`` wraps each
command body in ``guarded``; ``cli.py`` (the program) only parses and dispatches to those tasks."""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invoke.exceptions import Exit

from forgelib.errors import EXIT_INTERRUPTED, EXIT_UNEXPECTED, ForgeError, UsageError

log = logging.getLogger("forgelib")
LOG_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"  # benchmarks/harness.py reads it


def log_path() -> Path:
    """The debug log every command appends to (every external command, every traceback)."""
    if env := os.environ.get("FORGE_LOG"):
        return Path(env)
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "forgelib" / "forge.log"


def _setup_logging() -> Path:
    path = log_path()
    root = logging.getLogger("forgelib")
    for h in list(root.handlers):  # one forge handler, on the path asked for now (FORGE_LOG may change)
        if getattr(h, "_forge", False) and Path(getattr(h, "baseFilename", "")) != path.absolute():
            root.removeHandler(h)
            h.close()
    if not any(getattr(h, "_forge", False) for h in root.handlers):
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
        handler._forge = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
        root.setLevel(logging.DEBUG)
    return path


@dataclass(frozen=True)
class Number:
    """A numeric option as typed (``""``: left out). Converted inside ``guarded``, so ``forge`` and
    ``invoke`` (whose own parser would raise a traceback on ``--repeats x``) say the same usage error."""

    option: str  # "--repeats"
    text: str
    kind: type[int] | type[float] = int

    def value(self) -> int | float | None:
        if self.text == "":
            return None
        try:
            return self.kind(self.text)
        except ValueError:
            what = "a whole number" if self.kind is int else "a number"
            raise UsageError(f"{self.option} takes {what}, not {self.text!r}") from None


def guarded(command: Callable[..., int | None], **kwargs: Any) -> None:
    """Call a command body and map what it returns or raises to an exit code (``Number`` options are
    converted first, as part of the command)."""
    try:
        _guarded(command, **kwargs)
    except Exit as e:  # (_guarded raises them without a message)
        leave_cluster(e.code)
        raise
    leave_cluster(0)


def leave_cluster(code: int) -> None:
    """A process that joined a Ray cluster (``run --cluster``) exits here, without Ray's slow and crash-prone
    exit hooks (why that is safe: ``forgelib.cluster.connect.leave``); any other process returns."""
    connect = sys.modules.get("forgelib.cluster.connect")  # imported only under --cluster
    if connect is not None:
        connect.leave(code)


def _guarded(command: Callable[..., int | None], **kwargs: Any) -> None:
    path = _setup_logging()
    log.debug("command %s.%s %r", command.__module__, command.__qualname__, kwargs)
    try:
        args = {k: v.value() if isinstance(v, Number) else v for k, v in kwargs.items()}
        rc = command(**args)
    except ForgeError as e:
        log.debug("user error (exit %d): %s", e.exit_code, e)
        print(f"forge: error: {e}", file=sys.stderr)
        raise Exit(code=e.exit_code) from None
    except KeyboardInterrupt:
        log.debug("interrupted")
        print("forge: interrupted", file=sys.stderr)
        raise Exit(code=EXIT_INTERRUPTED) from None
    except Exit:
        raise
    except Exception as e:  # noqa: BLE001 - any other exception is a bug: log it, exit 3
        log.error("unexpected error\n%s", traceback.format_exc())
        print(
            f"forge: unexpected error (a bug in forgelib): {type(e).__name__}: {e}\n"
            f"forge: the full traceback is in {path}",
            file=sys.stderr,
        )
        raise Exit(code=EXIT_UNEXPECTED) from None
    if rc:
        raise Exit(code=rc)


__all__ = ["LOG_FORMAT", "Number", "guarded", "leave_cluster", "log_path"]
