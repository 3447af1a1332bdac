"""multi_service_endpoint_add end to end: the filesystem_dir recipe fires in testrunner and its result is
what runner sees through the shared volume; the real suite fails on the seed and passes after the oracle.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.modes import stack_args

pytestmark = pytest.mark.e2e

PACK = Path(__file__).resolve().parents[2] / "examples" / "multi_service_endpoint_add"
SEED = PACK / "assets" / "pristine_source"
TASK = "add_summary_endpoint"
ORACLE = PACK / "tasks" / TASK / "solve.py"
MARKER = ".test-results/status"


def _post_run_tests(base_url: str) -> dict[str, Any]:
    req = urllib.request.Request(f"{base_url}/run-tests", method="POST")
    with urllib.request.urlopen(req, timeout=180) as resp:
        result: dict[str, Any] = json.load(resp)
    return result


def test_seed_reaches_runner_and_the_suite_goes_from_fail_to_pass(provision_keep: Callable[..., Any]) -> None:
    stack = provision_keep(PACK, TASK)

    # The recipe ran in testrunner (/workspace); runner sees exactly the seed at /work via the volume.
    assert stack.read("runner", "/work/app.py") == (SEED / "app.py").read_bytes()
    listing = stack.exec("runner", ["find", "/work", "-mindepth", "1", "-printf", "%P\\n"])
    assert listing.returncode == 0, listing.stderr
    seed_entries = {p.relative_to(SEED).as_posix() for p in SEED.rglob("*")}
    assert set(listing.stdout.decode().split()) == seed_entries

    # The pristine source fails its own suite (test_order_summary), and the verdict lands in the volume.
    testrunner = stack.url("testrunner", 8000)
    pristine = _post_run_tests(testrunner)
    assert pristine["result"] == "FAIL", pristine["output"]
    assert "FAIL: test_order_summary" in pristine["output"]
    assert stack.read("runner", f"/work/{MARKER}") == b"FAIL"

    # The oracle, run by hand where forge runs it (runner, /work), adds the endpoint and gets a PASS.
    solved = stack.exec("runner", ["python3", "-"], input=ORACLE.read_bytes(), workdir="/work")
    assert solved.returncode == 0, solved.stderr.decode(errors="replace")
    assert stack.read("testrunner", f"/workspace/{MARKER}") == b"PASS"
    assert b'"/orders/{order_id}/summary"' in stack.read("testrunner", "/workspace/app.py")
    assert _post_run_tests(testrunner)["result"] == "PASS"  # and it stays green on a re-run


def test_dev_run_passes_with_the_marker_reading_pass(forge_run: Callable[..., Any], dev_stacks: str) -> None:
    # snapshots: filesystem_dir has no goldens (its apply is the copy one would be); the run still passes
    run = forge_run(PACK / "run_configs" / "dev.yaml", *stack_args(dev_stacks))
    assert run.rc == 0, run.explain()
    totals = run.summary["totals"]
    assert (totals["trials"], totals["passed"], totals["failed"]) == (2, 2, 0), run.explain()
    for t in run.trials(TASK):
        assert t.status == "passed", t.grade
        assert t.trial["termination_reason"] == "COMPLETED"
        assert t.observed("suite_passes") == "PASS"
        assert t.trial["oracle"]["rc"] == 0


def test_pack_validates_with_current_digests(forge: Callable[..., Any]) -> None:
    for args in (["validate", "--project", str(PACK)], ["stamp", "--check", "--project", str(PACK)]):
        proc = forge(*args)
        assert proc.returncode == 0, f"forge {' '.join(args)}: {proc.returncode}\n{proc.stdout}{proc.stderr}"
