"""Trace checks: questions about the agent's tool calls, answered from the trial's ``trace.jsonl``.

Pure but for ``read_trace``: calls in, ``CheckOutcome`` out. The questions (a check's ``trace:`` block):

- ``called`` / ``not_called``: a call matching a pattern happened / never happened;
- ``order``: a call matching ``first`` ended no later than the earliest call matching ``then`` started;
  ``on_missing`` (default fail) decides when either side has no matching call;
- ``bound``: ``capture`` (a regex with a group) binds group 1 from the *result* of each call matching
  ``from``; a call matching ``into`` that started after that call ended must hold the token in its argument
  ``arg`` (a plain substring). ``on_unbound`` (default fail) decides when no result matched ``capture``.

A call pattern: ``tool`` (exact), ``args`` (argument -> regex, searched with ``re.search`` and MULTILINE in
the argument's text: a string as-is, anything else as JSON; a dotted name reaches inside: ``headers.X``,
``argv.0``; a call without the argument does not match), ``result`` (a regex searched in the result text;
an errored call has none) and ``ok`` (true: succeeded calls only, the default; false: errored ones; any).
``not_called`` defaults to ``ok: any``: a forbidden call that errored was still attempted.

Without a readable trace (no ``trace.jsonl``: an oracle that acts outside the tools, a run from before
traces) a trace check *cannot be decided*: its outcome says why and is left out of the score, never a pass
or a fail (``grading`` scores only decided checks).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgelib.grading.score import CheckOutcome, render
from forgelib.mcp.trace import BadRecord, parse_records
from forgelib.spec.models import Check

TRACE_FILE = "trace.jsonl"
NO_TRACE = f"the trial has no {TRACE_FILE} (no tool calls were recorded)"
_REQUIRED = ("seq", "tool", "arguments", "started", "ended", "ok")


@dataclass(frozen=True)
class Call:
    """One recorded tool call (a line of trace.jsonl)."""

    seq: int
    tool: str
    arguments: Mapping[str, Any]
    started: float
    ended: float
    ok: bool
    result: str | None = None  # the text the agent received (maybe truncated); None on an error
    error: str | None = None

    def brief(self) -> str:
        shown = ", ".join(f"{k}={_clip(render(v), 60)}" for k, v in self.arguments.items() if k != "content")
        return f"#{self.seq} {self.tool}({shown})"


@dataclass(frozen=True)
class Trace:
    """A trial's calls in the order they were recorded, or why there are none to decide on."""

    calls: tuple[Call, ...] = ()
    undecidable: str | None = None  # set: every trace check "cannot be decided" for this reason
    torn: bool = False  # the last line was cut by a crash and left out


def read_trace(path: Path) -> Trace:
    """The calls in ``path`` (the MCP server's own reader, ``mcp.trace.parse_records``). A torn last line
    (a crash mid-write) is left out; a missing file or a broken line before the last makes the trace
    undecidable, with the reason."""
    if not path.is_file():
        return Trace(undecidable=NO_TRACE)
    try:
        raw = path.read_bytes()
    except OSError as e:
        return Trace(undecidable=f"{path.name} could not be read: {e}")
    return _parse(raw, path.name)


def parse_trace(text: str, name: str = TRACE_FILE) -> Trace:
    return _parse(text.encode("utf-8", "surrogatepass"), name)


def _parse(raw: bytes, name: str) -> Trace:
    def broken(line: int, why: str) -> Trace:
        return Trace(undecidable=f"{name} line {line} is not a recorded call ({_clip(why, 120)})")

    try:
        records, torn = parse_records(raw, name)
    except BadRecord as e:
        return broken(e.line, e.why)
    calls: list[Call] = []
    for n, record in records:
        try:
            calls.append(_call(record))
        except (ValueError, TypeError, KeyError) as e:
            return broken(n, str(e))
    return Trace(tuple(sorted(calls, key=lambda c: c.seq)), torn=torn)


def _call(d: dict[str, Any]) -> Call:
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise KeyError(f"no {', '.join(missing)}")
    if not isinstance(d["arguments"], dict):
        raise TypeError("arguments is not an object")
    result = d.get("result")
    return Call(
        seq=int(d["seq"]),
        tool=str(d["tool"]),
        arguments=d["arguments"],
        started=float(d["started"]),
        ended=float(d["ended"]),
        ok=bool(d["ok"]),
        result=None if result is None else render(result),
        error=None if d.get("error") is None else str(d["error"]),
    )


# ----------------------------------------------------------------------------------------- call patterns


def argument(args: Mapping[str, Any], dotted: str) -> str | None:
    """The text of argument ``dotted`` (``headers.X``, ``argv.0``), or None when the call has none."""
    value: Any = args
    for part in dotted.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif (
            isinstance(value, Sequence)
            and not isinstance(value, str)
            and part.isdigit()
            and int(part) < len(value)
        ):
            value = value[int(part)]
        else:
            return None
    return render(value)


def _search(pattern: str, text: str) -> re.Match[str] | None:
    return re.search(pattern, text, re.MULTILINE)


def matches_call(pattern: Mapping[str, Any], call: Call, *, ok_default: bool | str = True) -> bool:
    if call.tool != pattern["tool"]:
        return False
    want_ok = pattern.get("ok", ok_default)
    if want_ok != "any" and call.ok is not bool(want_ok):
        return False
    for name, regex in (pattern.get("args") or {}).items():
        text = argument(call.arguments, name)
        if text is None or _search(str(regex), text) is None:
            return False
    wanted = pattern.get("result")
    return wanted is None or (call.result is not None and _search(str(wanted), call.result) is not None)


def describe_call(pattern: Mapping[str, Any]) -> str:
    parts = [f"{k}~{v!r}" for k, v in (pattern.get("args") or {}).items()]
    if "result" in pattern:
        parts.append(f"result~{pattern['result']!r}")
    if "ok" in pattern:
        parts.append(f"ok={pattern['ok']}")
    return f"{pattern['tool']}({', '.join(parts)})"


# ----------------------------------------------------------------------------------------------- deciding


def decide(check: Check, trace: Trace) -> CheckOutcome:
    """``check`` (type trace) against ``trace``: passed, failed, or cannot be decided."""
    spec = check.spec
    question = next(q for q in ("called", "not_called", "order", "bound") if q in spec)
    expected = _expected(question, spec)
    if trace.undecidable is not None:
        return _outcome(
            check, False, None, expected, f"cannot be decided: {trace.undecidable}", decided=False
        )
    passed, observed = _ANSWER[question](spec, trace.calls)
    return _outcome(check, passed, observed, expected)


def _expected(question: str, spec: Mapping[str, Any]) -> str:
    body = spec[question]
    if question == "called":
        return f"a call {describe_call(body)}"
    if question == "not_called":
        return f"no call {describe_call(body)}"
    if question == "order":
        return (
            f"a call {describe_call(body['first'])} before any call {describe_call(body['then'])} "
            f"(on_missing: {spec.get('on_missing', 'fail')})"
        )
    return (
        f"a token captured by {body['capture']!r} from a call {describe_call(body['from'])}'s result, "
        f"in the {body['arg']} of a later call {describe_call(body['into'])} "
        f"(on_unbound: {spec.get('on_unbound', 'fail')})"
    )


def _called(spec: Mapping[str, Any], calls: Sequence[Call]) -> tuple[bool, str]:
    found = [c for c in calls if matches_call(spec["called"], c)]
    if not found:
        return False, f"no matching call among {len(calls)}"
    return True, f"{len(found)} matching, first {found[0].brief()}"


def _not_called(spec: Mapping[str, Any], calls: Sequence[Call]) -> tuple[bool, str]:
    found = [c for c in calls if matches_call(spec["not_called"], c, ok_default="any")]
    if not found:
        return True, f"no matching call among {len(calls)}"
    return False, f"{len(found)} matching, first {found[0].brief()}"


def _order(spec: Mapping[str, Any], calls: Sequence[Call]) -> tuple[bool, str]:
    body = spec["order"]
    firsts = [c for c in calls if matches_call(body["first"], c)]
    thens = [c for c in calls if matches_call(body["then"], c)]
    if not firsts or not thens:
        side = "first" if not firsts else "then"
        on_missing = spec.get("on_missing", "fail")
        return on_missing == "pass", f"no call matches {side!r} (on_missing: {on_missing})"
    earliest = min(thens, key=lambda c: (c.started, c.seq))
    before = [c for c in firsts if c.ended <= earliest.started and c.seq != earliest.seq]
    if before:
        return True, f"{before[0].brief()} ended before {earliest.brief()} started"
    return (
        False,
        f"{earliest.brief()} started before any matching {'first'!r} call ended ({firsts[0].brief()})",
    )


def _bound(spec: Mapping[str, Any], calls: Sequence[Call]) -> tuple[bool, str]:
    body = spec["bound"]
    bindings: list[tuple[str, Call]] = []
    for c in calls:
        if c.result is not None and matches_call(body["from"], c):
            m = _search(str(body["capture"]), c.result)
            if m is not None and m.group(1):
                bindings.append((m.group(1), c))
    if not bindings:
        on_unbound = spec.get("on_unbound", "fail")
        sources = sum(matches_call(body["from"], c) for c in calls)
        return on_unbound == "pass", (
            f"unbound: {sources} matching 'from' call(s), none whose result matched the capture "
            f"(on_unbound: {on_unbound})"
        )
    intos = [c for c in calls if matches_call(body["into"], c)]
    for token, source in bindings:
        for c in intos:
            text = argument(c.arguments, str(body["arg"]))
            if c.started >= source.ended and c.seq != source.seq and text is not None and token in text:
                return True, f"{token!r} bound from {source.brief()}; {c.brief()} {body['arg']} holds it"
    tokens = ", ".join(sorted({repr(t) for t, _ in bindings}))
    if not intos:
        return False, f"bound {tokens}; no matching 'into' call"
    return (
        False,
        f"bound {tokens}; no later matching 'into' call's {body['arg']} holds one ({len(intos)} checked)",
    )


_ANSWER = {"called": _called, "not_called": _not_called, "order": _order, "bound": _bound}


def _outcome(
    check: Check,
    passed: bool,
    observed: str | None,
    expected: str,
    error: str | None = None,
    *,
    decided: bool = True,
) -> CheckOutcome:
    return CheckOutcome(
        check.name, check.type, check.weight, check.gate, passed, observed, expected, error, decided=decided
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
