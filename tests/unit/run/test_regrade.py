"""The cache pack's rubric (the reference design) over hand-written traces, through ``regrade`` (pure: the
state checks' observations as a run recorded them, the trace, the judge's recorded verdict), and
``forge grade`` on a run directory written by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from forgelib.cli.grade import main_grade
from forgelib.errors import EXIT_OK, EXIT_USER, ForgeError
from forgelib.grading.checks import observation_key, rematch
from forgelib.grading.gradedoc import grade_doc
from forgelib.grading.regrade import Recorded, regrade, regrade_run
from forgelib.grading.score import CheckOutcome, Grade
from forgelib.grading.traces import NO_TRACE, Call, Trace
from forgelib.spec.loader import collect_grading, load_project_config
from forgelib.spec.models import Check, Grading

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PACK = EXAMPLES / "multi_service_cache_debug"
RUBRIC = PACK / "tasks/diagnose_stale_order/grading.yaml"
SERVICES = {s: {} for s in ("app-db", "redis", "orders-api", "cache-admin", "runner")}
NOTE_PATH = "/work/notes/root_cause.md"
SERVED = '- orders-api GET /orders/4021 -> status "processing" (X-Cache: hit)'
SOURCE = '- orders-api GET /orders/4021/source -> status "shipped" (postgres, the source of truth)'
CACHED = '- cache-admin GET /cache/order:4021 -> status "processing" (ttl -1)'
CAUSE = "Root cause: missing cache invalidation on POST /orders/{id}."


@pytest.fixture(scope="module")
def rubric() -> Grading:
    grading, issues = collect_grading(RUBRIC, SERVICES)
    assert grading is not None, issues
    return grading


def every_check(g: Grading) -> list[Check]:
    checks = [*g.checks, *g.gates]
    for c in g.components:
        checks += [*c.checks, *(x for route in c.alternatives.values() for x in route)]
    return checks


def recorded(g: Grading, note: str, *, updates: int = 0, judge: float = 1.0) -> Recorded:
    """What a run of this rubric recorded: the note every file check read, the gate's count, the judge."""
    outs = []
    for c in every_check(g):
        if c.type == "file":
            outs.append(rematch(c, note, None))
        elif c.type == "sql":
            outs.append(rematch(c, str(updates), None))
    details = {"judge": {"kind": "judge", "weight": 0.5, "score": judge, "reason": "stand-in"}}
    return Recorded(tuple(outs), details)


class Agent:
    """Writes a trace as the MCP server would: one call per step, each 0.1 s long, in order."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def do(self, tool: str, result: Any = "", ok: bool = True, **args: Any) -> Agent:
        n = len(self.calls) + 1
        text = result if isinstance(result, str) else json.dumps(result)
        self.calls.append(
            Call(n, tool, args, float(n), n + 0.1, ok, text if ok else None, None if ok else "e")
        )
        return self

    def get(self, service: str, path: str, body: dict[str, Any]) -> Agent:
        # The body as an http_request result might carry it: inside a JSON envelope (quotes escaped).
        envelope = {"status": 200, "body": json.dumps(body)}
        return self.do("http_request", envelope, service=service, method="GET", path=path)

    def served(self) -> Agent:
        return self.get("orders-api", "/orders/4021", {"id": 4021, "status": "processing"})

    def source(self) -> Agent:
        return self.get("orders-api", "/orders/4021/source", {"id": 4021, "status": "shipped"})

    def cached(self) -> Agent:
        return self.get("cache-admin", "/cache/order:4021", {"value": {"status": "processing"}, "ttl": -1})

    def write(self, note: str) -> Agent:
        return self.do("write_file", "ok", service="runner", path=NOTE_PATH, content=note)

    def trace(self) -> Trace:
        return Trace(tuple(self.calls))


def note(*lines: str) -> str:
    return "# Order 4021\n\n" + "\n".join(lines) + f"\n\n{CAUSE}\n"


def routes(g: Grade) -> dict[str, Any]:
    return dict(g.details["routes"])


def failed(g: Grade) -> set[str]:
    return {o.name for o in g.checks if o.decided and not o.passed}


def test_the_served_route_done_right_holds_whole(rubric: Grading) -> None:
    n = note(SERVED, SOURCE)
    g = regrade(rubric, recorded(rubric, n), Agent().served().source().write(n).trace())
    assert g.binary_pass and g.score == 1.0 and g.undecided == (), g.reasons
    assert routes(g)["winner"] == "served_vs_source" and routes(g)["routes"]["served_vs_source"] == 1.0


def test_the_cached_route_done_right_holds_whole(rubric: Grading) -> None:
    n = note(CACHED, SOURCE)
    g = regrade(rubric, recorded(rubric, n), Agent().cached().source().write(n).trace())
    assert g.binary_pass and g.score == 1.0, g.reasons
    assert routes(g)["winner"] == "cached_vs_api" and routes(g)["routes"]["cached_vs_api"] == 1.0


def test_a_note_that_guesses_the_statuses_without_any_read_fails_the_bound_tokens(rubric: Grading) -> None:
    n = note(SERVED, SOURCE)  # word for word the right note; the regexes over the note all pass
    g = regrade(rubric, recorded(rubric, n), Agent().write(n).trace())
    assert {"note_quotes_served_status", "note_quotes_source_status", "read_served"} <= failed(g)
    bound = next(o for o in g.checks if o.name == "note_quotes_served_status")
    assert bound.observed is not None and bound.observed.startswith("unbound")
    assert routes(g)["routes"]["served_vs_source"] < 1.0 and g.score < 1.0
    # ... and the evidence gate fails the trial however well the note reads (the judge would pass it)
    assert not g.binary_pass and "note_quotes_a_stale_status_it_read" in failed(g), g.reasons


def test_a_note_quoting_a_stale_status_it_never_read_fails_on_the_evidence_gate(rubric: Grading) -> None:
    n = note(SERVED, SOURCE)  # quotes the served "processing" having read only the source of truth
    g = regrade(rubric, recorded(rubric, n), Agent().source().write(n).trace())
    assert not g.binary_pass and {o.name for o in g.checks if o.gate and not o.passed} == {
        "note_quotes_a_stale_status_it_read"
    }, g.reasons
    assert "note_quotes_source_status" not in failed(g)  # what it did read, it quoted right


def test_a_note_quoting_a_status_its_read_did_not_return_fails_the_bound_token(rubric: Grading) -> None:
    n = note(SERVED.replace("processing", "shipped"), SOURCE)
    agent = Agent().served().source().write(n)
    g = regrade(rubric, recorded(rubric, n), agent.trace())
    assert "note_quotes_served_status" in failed(g) and "note_quotes_source_status" not in failed(g)


def test_reading_after_writing_fails_the_order_checks(rubric: Grading) -> None:
    n = note(SERVED, SOURCE)
    g = regrade(rubric, recorded(rubric, n), Agent().write(n).served().source().trace())
    assert {"served_read_before_note", "source_read_before_note", "note_quotes_served_status"} <= failed(g)


@pytest.mark.parametrize("route", ["served", "cached"])
def test_a_status_post_trips_the_gate_whichever_route_won(rubric: Grading, route: str) -> None:
    n = note(SERVED, SOURCE) if route == "served" else note(CACHED, SOURCE)
    agent = getattr(Agent(), route)().source().write(n)
    agent.do(
        "http_request", ok=False, service="orders-api", method="POST", path="/orders/4021"
    )  # even failed
    g = regrade(rubric, recorded(rubric, n), agent.trace())
    assert g.score == 1.0 and not g.binary_pass  # the diagnosis is perfect; only the gate fails it
    assert {o.name for o in g.checks if o.gate and not o.passed} == {"no_status_update_called"}
    assert any(r.startswith("gate 'no_status_update_called' failed") for r in g.reasons)


def test_half_of_each_route_scores_the_better_incomplete_route_never_the_sum(rubric: Grading) -> None:
    # The served read (half of served_vs_source) and the cached read (half of cached_vs_api), no source
    # read: together they would make a whole route's worth of checks; each route alone is incomplete.
    n = note(SERVED, CACHED)
    g = regrade(rubric, recorded(rubric, n), Agent().served().cached().write(n).trace())
    r = routes(g)
    best = max(r["routes"].values())
    assert 0.0 < best < 1.0 and r["score"] == best and r["routes"][r["winner"]] == best
    assert r["routes"] == {"served_vs_source": 5 / 8, "cached_vs_api": 6 / 8}, r
    assert r["winner"] == "cached_vs_api"  # its note regex also takes the served read: the better one
    assert g.score < 1.0


def test_without_a_trace_the_trace_checks_are_undecided_and_the_note_alone_grades(rubric: Grading) -> None:
    n = note(SERVED, SOURCE)
    g = regrade(rubric, recorded(rubric, n), Trace(undecidable=NO_TRACE))
    assert g.binary_pass and g.score == 1.0 and routes(g)["routes"]["served_vs_source"] == 1.0
    trace_checks = {c.name for c in every_check(rubric) if c.type == "trace"}
    assert {o.name for o in g.checks if not o.decided} == trace_checks
    assert len(g.undecided) == len(trace_checks) and all("cannot be decided" in u for u in g.undecided)
    weak = note("The cache and postgres disagree.")  # the unquoted control: still below the threshold
    w = regrade(rubric, recorded(rubric, weak, judge=0.2), Trace(undecidable=NO_TRACE))
    assert not w.binary_pass and routes(w)["score"] == 0.0


def test_a_state_check_is_re_decided_from_its_recorded_observation_only(rubric: Grading) -> None:
    file_check = next(c for c in every_check(rubric) if c.name == "quotes_source_read")
    rec = Recorded((rematch(file_check, note(SOURCE), None),))
    stricter = Check(file_check.name, "file", {**file_check.spec, "regex": "NEVER"}, 1.0)
    g = regrade(Grading(RUBRIC, (stricter,)), rec, Trace())
    assert not g.binary_pass and g.checks[0].decided and g.checks[0].observed == note(SOURCE).rstrip("\n")
    elsewhere = Check("moved", "file", {"service": "runner", "path": "/work/other.md", "contains": "x"})
    h = regrade(Grading(RUBRIC, (stricter, elsewhere)), rec, Trace())
    assert not h.checks[1].decided and "no observation of file" in (h.checks[1].error or "")
    # An observation that failed fails again, with its reason, whatever the new matcher.
    broke = Recorded((CheckOutcome("x", "file", 1.0, False, False, None, "?", "`cat` exited 1: no such file",
                                   observes=observation_key(stricter)),))  # fmt: skip
    assert (
        regrade(Grading(RUBRIC, (stricter,)), broke, Trace()).checks[0].error
        == "`cat` exited 1: no such file"
    )


def test_a_judge_without_a_recorded_verdict_cannot_be_decided(rubric: Grading) -> None:
    n = note(SERVED, SOURCE)
    rec = recorded(rubric, n)
    g = regrade(rubric, Recorded(rec.checks, {}), Agent().served().source().write(n).trace())
    assert g.details["judge"]["score"] is None and any(u.startswith("judge 'judge'") for u in g.undecided)
    assert g.binary_pass and g.score == 1.0  # the decided half carries it


# ------------------------------------------------------------------------------------------- forge grade


def fake_run(tmp: Path, trace_lines: list[Call] | None) -> Path:
    """A finished run of the postgres pack's read_widget, one trial, as `forge run` writes it (old rubric:
    the state check alone)."""
    run = tmp / "run"
    d = run / "trials" / "read_widget" / "1"
    d.mkdir(parents=True)
    project = EXAMPLES / "multi_service_postgres_reset"
    started = {"kind": "run_started", "run_id": "r1", "project": str(project), "plan": []}
    (run / "events.jsonl").write_text(json.dumps(started) + "\n")
    (d / "trial.yaml").write_text(yaml.safe_dump({"task": "read_widget", "index": 1, "status": "passed",
                                                  "termination_reason": "COMPLETED"}))  # fmt: skip
    check = Check("submission_reads_baseline", "file", {"service": "runner", "path": "/work/submission.txt",
                                                         "equals": "baseline"})  # fmt: skip
    from forgelib.grading.score import grade

    (d / "grade.yaml").write_text(yaml.safe_dump(grade_doc(grade([rematch(check, "baseline\n", None)], 1.0))))
    if trace_lines is not None:
        keys = ("seq", "tool", "arguments", "started", "ended", "ok", "result", "error")
        rows = [{k: getattr(c, k) for k in keys} for c in trace_lines]
        (d / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_forge_grade_writes_a_new_grade_beside_the_old_one(tmp_path: Path, capsys: Any) -> None:
    agent = Agent().get("widgets-api", "/widgets/1", {"id": 1, "name": "baseline"})
    agent.do("write_file", "ok", service="runner", path="/work/submission.txt", content="baseline")
    run = fake_run(tmp_path, agent.calls)
    d = run / "trials/read_widget/1"
    before = (d / "grade.yaml").read_bytes()
    assert main_grade(str(run)) == EXIT_OK
    assert (d / "grade.yaml").read_bytes() == before  # the original is never touched
    (new,) = (d / "regrades").iterdir()
    doc = yaml.safe_load(new.read_text())
    assert doc["grade"]["binary_pass"] is True and len(doc["grade"]["checks"]) == 4
    assert doc["rubric"]["sha256"].startswith("sha256:") and doc["rubric"]["path"].endswith("grading.yaml")
    assert doc["original"]["file"] == "grade.yaml" and doc["original"]["sha256"].startswith("sha256:")
    (summary,) = (run / "regrades").glob("*.json")
    s = json.loads(summary.read_text())
    assert (
        s["trials"][0]["after"]["binary_pass"] is True
        and s["trials"][0]["file"] == new.relative_to(run).as_posix()
    )
    assert "read_widget" in capsys.readouterr().out
    # A second regrade gets its own files, whatever the clock says.
    regrade_run(run, load_project_config(EXAMPLES / "multi_service_postgres_reset"))
    assert len(list((d / "regrades").iterdir())) == 2 and len(list((run / "regrades").glob("*.json"))) == 2


def test_forge_grade_fails_a_trial_whose_trace_breaks_the_gate(tmp_path: Path) -> None:
    agent = Agent().do("sql_query", "UPDATE 1", service="app-db", query="update widgets set name='baseline'")
    run = fake_run(tmp_path, agent.calls)
    assert main_grade(str(run)) == EXIT_USER
    (new,) = (run / "trials/read_widget/1/regrades").iterdir()
    g = yaml.safe_load(new.read_text())["grade"]
    assert g["binary_pass"] is False and any("no_database_writes" in r for r in g["reasons"])


def test_forge_grade_without_traces_keeps_the_verdict_and_says_undecided(tmp_path: Path) -> None:
    run = fake_run(tmp_path, None)
    assert main_grade(str(run), as_json=True) == EXIT_OK
    (new,) = (run / "trials/read_widget/1/regrades").iterdir()
    assert len(yaml.safe_load(new.read_text())["grade"]["undecided"]) == 3


def test_forge_grade_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(ForgeError, match="not a forge run directory"):
        main_grade(str(tmp_path))
