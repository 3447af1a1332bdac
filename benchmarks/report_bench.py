"""Report: how long `forge report`'s page of a 1,000-trial run takes to be on screen in headless Chromium.

The run is synthetic (``tests/support/runlog.py``: 1,000 trials on 4 workers with failures, retries, an
interruption and a resume), shaped exactly like a real ``events.jsonl``. Each round loads the page in a
fresh navigation and reads the page's own figures: ``paintedMs`` (navigation start until the first frame
after the page is built) and ``renderMs`` (the page script). The baseline, measured in the same browser in
the same run, is a page carrying the same data that only parses it: the ratio is what laying it out costs
over merely shipping it. Chromium comes from ``scripts/browser.sh`` (Debian's chromium + chromium-driver).

Size: ``--trials`` (default 1000, ``FORGE_BENCH_REPORT_TRIALS``); ``--rounds`` (default 7).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness as bs

NAME = "report"
TARGET_MS = 1000.0  # the bar: a 1,000-trial run on screen in under a second

_BASELINE = (
    "<!doctype html><html><body>{data}<script>JSON.parse(document.getElementById('data').textContent);"
    "window.forgeReport={{}};requestAnimationFrame(()=>setTimeout(()=>{{"
    "window.forgeReport.paintedMs=performance.now();document.body.dataset.ready='1'}}))</script></body></html>"
)


def _baseline(report: str) -> str:
    start = report.index('<script id="data"')
    end = report.index("</script>", start) + len("</script>")
    return _BASELINE.format(data=report[start:end])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--trials", type=int, default=bs.env_int("FORGE_BENCH_REPORT_TRIALS", 1000))
    parser.add_argument("--rounds", type=int, default=bs.env_int("FORGE_BENCH_REPORT_ROUNDS", 7))
    args = parser.parse_args(argv)
    meta = bs.start_meta(rounds=args.rounds)
    sys.path.insert(
        0, str(bs.REPO / "tests")
    )  # the synthetic log and the WebDriver client live with the tests
    from support.browser import chromium
    from support.runlog import synthetic_run, write_log

    from forgelib.report.page import write_report

    with tempfile.TemporaryDirectory(prefix="forge-bench-report-") as tmp:
        run_dir = Path(tmp) / "run"
        write_log(run_dir, synthetic_run(args.trials))
        page = write_report(run_dir)
        base = run_dir / "baseline.html"
        base.write_text(_baseline(page.read_text(encoding="utf-8")), encoding="utf-8")
        painted: list[float] = []
        rendered: list[float] = []
        baseline: list[float] = []
        with chromium(Path(tmp) / "profile") as browser:
            for i in range(args.rounds):  # interleaved, so machine load hits both alike
                browser.open(f"{page.as_uri()}?round={i}")
                figures = browser.run("return window.forgeReport")
                painted.append(float(figures["paintedMs"]))
                rendered.append(float(figures["renderMs"]))
                browser.open(f"{base.as_uri()}?round={i}")
                baseline.append(float(browser.run("return window.forgeReport.paintedMs")))
        size = page.stat().st_size
    med, med_base = bs.median(painted), bs.median(baseline)
    rows = [
        {"page": "report", "trials": args.trials, "bytes": size, "painted_ms_median": round(med, 1),
         "painted_ms_min": round(min(painted), 1), "script_ms_median": round(bs.median(rendered), 1)},
        {"page": "baseline (parse only)", "trials": args.trials, "painted_ms_median": round(med_base, 1),
         "painted_ms_min": round(min(baseline), 1)},
    ]  # fmt: skip
    verdict = "OK" if med < TARGET_MS else "OVER TARGET"
    notes = [
        f"report on screen: median {med:.0f} ms, target < {TARGET_MS:.0f} ms: {verdict}",
        f"ratio report / baseline (median): {bs.ratio(med, med_base):.2f}",
    ]
    meta.update(painted_ms=[round(x, 1) for x in painted], ok=med < TARGET_MS)
    return bs.report(NAME, rows, meta=meta, notes=notes)


if __name__ == "__main__":
    main()
