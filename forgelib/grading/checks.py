"""Observing a trial's state for its checks: a file, a SQL result, a redis reply, an HTTP response.

file/sql/redis go through ``docker compose exec`` (the runner seam, with the grading timeout); http goes
from the host to the service's published port with urllib. An observation that fails (a missing file, a
SQL error, a refused connection) is a failed check with the reason, not a crashed trial.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Unpack

from forgelib.docker.resolved import ResolvedConfig
from forgelib.errors import ForgeError, Interrupted
from forgelib.grading.score import CheckOutcome, Matcher, matcher_of, matches, render
from forgelib.grading.traces import NO_TRACE, Trace, decide
from forgelib.kinds import registry as kinds
from forgelib.kinds.base import ObservationError, exec_failure, observe_exec
from forgelib.runner import Result

__all__ = ["ObservationError", "exec_failure"]  # the kinds' (forgelib.kinds.base), named here for grading
from forgelib.spec.models import MATCHERS, Check
from forgelib.stacks.stack import ExecOptions, ServiceAccess

HTTP_BODY_LIMIT = 1 << 20  # an HTTP check reads at most 1 MiB of the response


def read_argv(path: str) -> list[str]:
    """How a check or a judge's ``input`` reads a file in a service (one spelling: ``ReadOnce`` knows it)."""
    return ["cat", "--", path]


class ReadOnce:
    """A grading pass's view of the stack in which each file is read once, however many checks (and the
    judge's ``input``) look at it, and each published port is looked up once. A ``docker exec cat`` costs
    the engine real time, and execs into one container do not overlap (six at once take as long as six in
    a row); a rubric may well read one note from several checks. Only for a pass without a mutating
    check: its reads then all observe the same state, so one answer serves them all."""

    def __init__(self, stack: ServiceAccess) -> None:
        self._stack = stack
        self._lock = threading.Lock()
        self._answers: dict[tuple[Any, ...], Future[Any]] = {}

    def exec(self, service: str, argv: Sequence[str], **options: Unpack[ExecOptions]) -> Result:
        plain = set(options) <= {"timeout", "check"} and not options.get("check", True)
        if plain and argv and list(argv) == read_argv(argv[-1]):
            key = ("exec", service, tuple(argv))
            return self._once(key, lambda: self._stack.exec(service, argv, **options))  # type: ignore[no-any-return]
        return self._stack.exec(service, argv, **options)

    def port(self, service: str, container_port: int) -> tuple[str, int]:
        key = ("port", service, container_port)
        return self._once(key, lambda: self._stack.port(service, container_port))  # type: ignore[no-any-return]

    def _once(self, key: tuple[Any, ...], fetch: Callable[[], Any]) -> Any:
        """The first caller of ``key`` fetches; the others wait for its answer (or its error)."""
        with self._lock:
            answer = self._answers.get(key)
            mine = answer is None
            if answer is None:
                answer = self._answers[key] = Future()
        if mine:
            try:
                answer.set_result(fetch())
            # Whatever it is (a timeout, a lost engine), every waiter sees it and none waits forever.
            except BaseException as e:  # noqa: BLE001
                answer.set_exception(e)
        return answer.result()


def evaluate(
    stack: ServiceAccess,
    check: Check,
    resolved: ResolvedConfig,
    *,
    timeout: float,
    trace: Trace | None = None,
) -> CheckOutcome:
    """Observe ``check``'s state and match it; every observation failure becomes a failed outcome. A trace
    check is decided from ``trace`` (None: the trial has none, so it cannot be decided).

    ``resolved``: the stack's services as compose resolved them (``Stack.resolved``: variables
    interpolated), which tell a kind's check how to reach its service.
    """
    if check.type == "trace":
        return decide(check, trace if trace is not None else Trace(undecidable=NO_TRACE))
    spec = check.spec
    try:
        matcher = _matcher_for(check)
    except ValueError as e:
        return _outcome(check, passed=False, observed=None, expected="?", error=str(e))
    expected = matcher.describe() if matcher else "success"
    try:
        if check.type == "http":
            observed, status_error = _http(stack, spec, timeout=timeout)
            if status_error is not None:
                return _outcome(check, passed=False, observed=observed, expected=expected, error=status_error)
        elif check.type == "file":
            observed = observe_exec(stack, spec["service"], read_argv(str(spec["path"])), timeout)
        else:
            observed = _by_kind(stack, check.type, spec, resolved, timeout)
    except ObservationError as e:
        return _outcome(check, passed=False, observed=None, expected=expected, error=str(e))
    return _matched(check, matcher, observed, expected)


def rematch(check: Check, observed: str | None, error: str | None) -> CheckOutcome:
    """``check`` decided from an observation recorded earlier (``forge grade``, after the stack is gone):
    one that failed (``error``: nothing observed, or an http status other than expected) fails again with
    its reason; one that was made is matched with the check's matcher, which may be new."""
    try:
        matcher = _matcher_for(check)
    except ValueError as e:
        return _outcome(check, passed=False, observed=None, expected="?", error=str(e))
    expected = matcher.describe() if matcher else "success"
    if error is not None or observed is None:
        why = error or "nothing was observed"
        return _outcome(check, passed=False, observed=observed, expected=expected, error=why)
    return _matched(check, matcher, observed, expected)


def _matched(check: Check, matcher: Matcher | None, observed: str, expected: str) -> CheckOutcome:
    if matcher is None:
        return _outcome(check, passed=True, observed=observed, expected=expected)
    try:
        ok = matches(matcher, observed)
    except ValueError as e:  # e.g. an invalid regex
        return _outcome(check, passed=False, observed=observed, expected=expected, error=str(e))
    return _outcome(check, passed=ok, observed=observed, expected=expected)


def _outcome(
    check: Check, *, passed: bool, observed: str | None, expected: str, error: str | None = None
) -> CheckOutcome:
    # Stored without the trailing newline cat/psql print: matchers ignore it, and grade.yaml reads better.
    shown = observed.rstrip("\r\n") if observed is not None else None
    return CheckOutcome(
        check.name, check.type, check.weight, check.gate, passed, shown, expected, error,
        observes=observation_key(check),
    )  # fmt: skip


def observation_key(check: Check) -> str:
    """What a state check asks to observe, as one canonical string: its type and every field but the
    matcher (an http check's expected status included: its recorded error depends on it)."""
    spec = {k: v for k, v in check.spec.items() if k not in MATCHERS}
    if isinstance(spec.get("json"), Mapping):
        spec["json"] = {"field": spec["json"]["field"]}
    return f"{check.type} {render(spec)}"


def _matcher_for(check: Check) -> Matcher | None:
    if check.type == "http" and isinstance(check.spec.get("json"), Mapping):
        return matcher_of(check.spec["json"])
    return matcher_of(check.spec)


def _by_kind(
    stack: ServiceAccess, check_type: str, spec: Mapping[str, Any], resolved: ResolvedConfig, timeout: float
) -> str:
    """A kind's check type, observed by the kind recognised for its service (``forgelib.kinds``)."""
    svc = resolved.service(str(spec["service"]))
    kind = kinds.kind_for_check(check_type, svc)
    if kind is None:
        if not kinds.kinds_for_check(check_type):
            known = ", ".join(("file", *kinds.CHECK_TYPES, "http"))
            raise ObservationError(f"unknown check type {check_type!r}; known: {known}")
        raise ObservationError(
            f"service {spec['service']!r} runs {kinds.server_kind(svc)}, which has no {check_type} check"
        )
    return kinds.observer(kind, check_type)(stack, spec, svc, timeout)


def _http(stack: ServiceAccess, spec: Mapping[str, Any], *, timeout: float) -> tuple[str, str | None]:
    """(observed text, status mismatch) — the text is the JSON field when ``json`` is given, else the body."""
    try:
        host, port = stack.port(spec["service"], int(spec["port"]))
    except Interrupted:
        raise
    except ForgeError as e:
        raise ObservationError(
            f"no published port {spec['port']} for service {spec['service']!r}: {e}"
        ) from None
    path = str(spec.get("path", "/"))
    url = f"http://{host}:{port}{path if path.startswith('/') else '/' + path}"
    data = None
    headers = {str(k): str(v) for k, v in (spec.get("headers") or {}).items()}
    if "body" in spec:
        body = spec["body"]
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        headers.setdefault("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
    method = str(spec.get("method", "GET")).upper()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text = resp.status, resp.read(HTTP_BODY_LIMIT).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:  # 4xx/5xx still carry a status and body the check may expect
        status, text = e.code, e.read(HTTP_BODY_LIMIT).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        raise ObservationError(f"{method} {url} failed: {getattr(e, 'reason', e)}") from None
    want = spec.get("status")
    status_error = None
    if want is not None and int(want) != status:
        status_error = f"{method} {url} returned status {status}, expected {want}"
    if isinstance(spec.get("json"), Mapping):
        return _json_field(text, str(spec["json"]["field"]), url), status_error
    return text, status_error


def _json_field(text: str, dotted: str, url: str) -> str:
    """The field at ``dotted`` (``a.b.0.c``) in the JSON body, rendered for the matcher."""
    try:
        value: Any = json.loads(text)
    except ValueError:
        raise ObservationError(f"{url} did not return JSON: {text[:200]!r}") from None
    for part in dotted.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise ObservationError(f"{url}: the JSON response has no field {dotted!r}")
    return render(value)
