"""multi_service_postgres_reset end to end: the sql_dump recipe fires on every trial, and only because of it.

init.sql leaves widget 1 as 'factory_default'; the postgres_baseline seed makes it 'baseline'. The dev run
must observe 'baseline' on both trials; the control (the same pack with app-db out of reset isolation, so
no binding) must observe 'factory_default' — otherwise a green dev run would not prove the seed ran.
The bare run proves a `bare` seed reaches the trial: the oracle reads it inside the container.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from support.modes import stack_args

pytestmark = pytest.mark.e2e

PACK = Path(__file__).resolve().parents[2] / "examples" / "multi_service_postgres_reset"
CHECK = "submission_reads_baseline"


def _recipe_timings(trial: Mapping[str, Any]) -> list[str]:
    """The per-seed timing entries trial.yaml records for app-db (one per recipe applied)."""
    return [k for k in trial["timings"] if k.startswith("recipe") and "app-db" in k]


def test_dev_run_observes_the_seeded_baseline(forge_run: Callable[..., Any], dev_stacks: str) -> None:
    run = forge_run(PACK / "run_configs" / "dev.yaml", *stack_args(dev_stacks))
    assert run.rc == 0, run.explain()
    stacks = "fresh" if dev_stacks == "snapshots" else dev_stacks
    assert run.summary["stacks"] == {"mode": stacks, "replaced": 0}
    totals = run.summary["totals"]
    assert (totals["trials"], totals["passed"], totals["failed"]) == (2, 2, 0), run.explain()

    trials = run.trials("read_widget")
    assert [t.dir.name for t in trials] == ["0", "1"]
    for t in trials:
        assert t.status == "passed", t.grade
        assert t.trial["termination_reason"] == "COMPLETED"
        assert t.grade["binary_pass"] is True
        assert t.grade["score"] == 1.0
        assert t.observed(CHECK) == "baseline"
    first, second = (t.trial for t in trials)
    if dev_stacks == "snapshots":  # app-db of the second trial started from the golden (the first took it,
        # or found one an earlier run on this engine took): no recipe, the golden's fingerprint checked
        outcomes = [t["snapshots"]["app-db"]["outcome"] for t in (first, second)]
        assert outcomes[0] in ("captured", "restored") and outcomes[1] == "restored", outcomes
        assert not _recipe_timings(second) and "golden_verify:app-db" in second["timings"], second["timings"]
        return
    assert _recipe_timings(first), first["timings"]  # the first trial applied the seed itself
    if stacks == "fresh":  # ... and so did the second, on its own compose project
        assert _recipe_timings(second), second["timings"]
        assert first["compose_project"] != second["compose_project"]
    else:  # ... while the second reset the same stack in place
        # (reset when the first gave the stack back: its steps are on the stack's record, not the trial's)
        assert "reset:app-db" in second["stack"]["reset_ahead"], second["stack"]
        assert not _recipe_timings(second), second["timings"]
        assert first["compose_project"] == second["compose_project"]
        assert (first["stack"]["reuse"], second["stack"]["reuse"]) == (0, 1)


def test_control_without_the_reset_binding_observes_factory_default(
    forge_run: Callable[..., Any], stacks: str
) -> None:
    run = forge_run(PACK / "run_configs" / "control.yaml", "--stacks", stacks)
    assert run.rc == 1, run.explain()  # a red trial: exit 1, not a crash or usage error

    (t,) = run.trials("read_widget_without_reset")
    # The stack came up and the oracle ran fine: the trial is graded red, not an error.
    assert t.trial["termination_reason"] == "COMPLETED", t.trial
    assert t.status == "failed"
    assert t.grade["binary_pass"] is False
    assert t.observed(CHECK) == "factory_default"
    assert not _recipe_timings(t.trial), t.trial["timings"]  # no binding, no recipe
    assert any(CHECK in r and "factory_default" in r for r in t.grade["reasons"]), t.grade["reasons"]


def test_a_bare_seed_reaches_the_oracle_inside_its_service(forge_run: Callable[..., Any]) -> None:
    """The bare convention: widget_order is bind-mounted read-only in runner and FORGE_SEED_WIDGET_ORDER
    names it in the oracle's exec; the oracle's submission is built from the file's content."""
    run = forge_run(PACK / "run_configs" / "bare.yaml")
    assert run.rc == 0, run.explain()
    (t,) = run.trials("read_bare_order")
    assert t.status == "passed", t.grade
    assert t.observed("order_from_the_bare_seed") == "7 x baseline (PO-2291)"
    assert t.observed("seed_mounted_read_only") == "read-only"
    assert t.trial["bare_seeds"] == {
        "runner": {
            "seed": "widget_order",
            "host_path": str(PACK / "assets" / "widget_order.json"),
            "path": "/run/forge/seeds/widget_order",
            "env": "FORGE_SEED_WIDGET_ORDER",
        }
    }


def test_pack_validates_with_current_digests(forge: Callable[..., Any]) -> None:
    for args in (["validate", "--project", str(PACK)], ["stamp", "--check", "--project", str(PACK)]):
        proc = forge(*args)
        assert proc.returncode == 0, f"forge {' '.join(args)}: {proc.returncode}\n{proc.stdout}{proc.stderr}"


def test_the_runs_report_in_a_real_browser(
    forge_run: Callable[..., Any], tmp_path: Path, artifacts: Path
) -> None:
    """Both tasks (one passes, the control fails its check) on two workers, `--report`, then the page in
    headless Chromium: one row and one bar per trial, the failure marked, a filter applied, a screenshot."""
    from support.browser import chromium

    config = tmp_path / "both.yaml"
    config.write_text(
        f"project: {PACK}\ntasks: [read_widget, read_widget_without_reset]\nrepeats: 1\nworkers: 2\n"
        "timeouts: {compose_up: 180, recipe: 120, oracle: 60, grading: 60, teardown: 120}\n"
    )
    run = forge_run(config, "--report")
    assert run.rc == 1, run.explain()  # the control trial fails, as it must
    report = run.run_dir / "report.html"
    assert report.is_file(), run.explain()
    expected = {f"{t['task']}[{t['index']}]": t["status"] for t in run.summary["trials"]}
    assert sorted(expected.values()) == ["failed", "passed"], run.summary

    with chromium(tmp_path / "chromium-profile") as browser:
        browser.open(report.as_uri())
        rows = browser.run(
            "return [...document.querySelectorAll('#rows tr')].map(r =>"
            " [r.cells[0].textContent, r.cells[1].textContent, r.hidden])"
        )
        assert {key: status for key, status, _ in rows} == expected
        assert not any(hidden for *_, hidden in rows)
        bars = browser.run(
            "return [...document.querySelectorAll('#timeline rect.hit')].map(b =>"
            " [b.dataset.key, b.dataset.failed === '1', b.getBBox().width > 0])"
        )
        assert sorted(key for key, *_ in bars) == sorted(expected)  # one attempt each
        assert {key for key, failed, _ in bars if failed} == {k for k, s in expected.items() if s == "failed"}
        assert all(visible for *_, visible in bars)
        lanes = browser.run("return [...document.querySelectorAll('#timeline text')].map(t => t.textContent)")
        assert {"w0", "w1"} & set(lanes), lanes
        # A file link of each row points at a file the run wrote.
        links = browser.run("return [...document.querySelectorAll('#rows a')].map(a => a.href)")
        assert links and all(
            Path(urllib.parse.unquote(urllib.parse.urlparse(u).path)).is_file() for u in links
        )
        browser.screenshot(artifacts / "report.png")

        # The status filter, through the page's own control.
        browser.click("#f-status option[value='failed']")
        browser.wait_for("return document.body.dataset.shown === '1'")
        shown = browser.run(
            "return [...document.querySelectorAll('#rows tr')].filter(r => !r.hidden)"
            ".map(r => r.cells[0].textContent)"
        )
        assert shown == [k for k, s in expected.items() if s == "failed"]
        lit = browser.run(
            "return [...document.querySelectorAll('#timeline rect.hit:not(.off)')].map(b => b.dataset.key)"
        )
        assert lit == shown
        assert browser.run("return location.hash") == "#status=failed"
        assert browser.run("return document.getElementById('shown').textContent") == "1 of 2 trial(s) shown"
        browser.screenshot(artifacts / "report-failed-only.png")
        timing = browser.run("return window.forgeReport")
    (artifacts / "render.json").write_text(json.dumps(timing))  # for a person to read; not asserted

    # With JavaScript off (a mail client, a CI artifact viewer): every trial and every check, its result
    # and reason, in the page's own HTML. WebDriver's scripts still run; the page's do not.
    with chromium(tmp_path / "chromium-nojs", javascript=False) as browser:
        browser.open(report.as_uri(), ready="return document.readyState === 'complete'")
        assert browser.run("return [document.body.dataset.ready, typeof window.forgeReport]") == [
            None,
            "undefined",
        ]
        assert browser.run("return document.getElementById('timeline').childElementCount") == 0
        rows = browser.run(
            "return [...document.querySelectorAll('#rows tr')].map(r =>"
            " [r.cells[0].innerText, r.cells[1].innerText, [...r.querySelectorAll('li.check')].map(li =>"
            " [li.dataset.check, li.dataset.result, li.querySelector('.badge').innerText,"
            " (li.querySelector('.why') || {innerText: null}).innerText,"
            " li.getBoundingClientRect().height > 0])])"
        )
        assert {key: status for key, status, _ in rows} == expected
        for key, _, checks in rows:
            (trial,) = [t for t in run.summary["trials"] if f"{t['task']}[{t['index']}]" == key]
            assert [c[:4] for c in checks] == [
                [c["name"], c["result"], c["result"], c["reason"]] for c in trial["checks"]
            ], key
            assert all(shown for *_, shown in checks)
        results = {c[1] for _, _, checks in rows for c in checks}
        assert results == {"passed", "failed", "undecided"}, rows  # the oracle leaves no trace to decide
        browser.screenshot(artifacts / "report-nojs.png")
