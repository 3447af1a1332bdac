"""testrunner: runs the orders service's real unittest suite on demand and records PASS/FAIL in the volume.

POST /run-tests runs ``python3 -m unittest -v`` in /workspace (the shared volume the runner edits at /work)
and writes the verdict to /workspace/.test-results/status (``PASS`` or ``FAIL``, no newline) and the output to
/workspace/.test-results/output.log, then answers with both.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from fastapi import FastAPI

WORKSPACE = Path(os.environ.get("WORKSPACE", "/workspace"))
RESULTS = WORKSPACE / ".test-results"
TIMEOUT = float(os.environ.get("TEST_TIMEOUT_SECONDS", "120"))

app = FastAPI(title="testrunner")
# One suite at a time: two overlapping runs would interleave their writes to the same marker.
_lock = threading.Lock()


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _verdict(rc: int, output: str) -> str:
    # Python 3.11's unittest exits 0 when it finds no tests at all; an emptied suite must not read as PASS.
    ran = re.search(r"^Ran (\d+) tests? in ", output, re.MULTILINE)
    return "PASS" if rc == 0 and ran is not None and int(ran.group(1)) > 0 else "FAIL"


@app.post("/run-tests")
def run_tests() -> dict[str, Any]:
    with _lock:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "unittest", "-v"],
                cwd=WORKSPACE,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
            )
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, output = -1, f"{e.stdout or ''}{e.stderr or ''}\ntimed out after {TIMEOUT:g}s"
        verdict = _verdict(rc, output)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "output.log").write_text(output, encoding="utf-8")
        (RESULTS / "status").write_text(verdict, encoding="utf-8")
    return {"result": verdict, "returncode": rc, "output": output[-4000:]}
