"""Real headless Chromium for the report's tests: Debian's ``chromium`` driven through ``chromedriver``.

``scripts/browser.sh`` installs both (idempotent; the fixture calls it). The W3C WebDriver protocol is
plain HTTP + JSON, so this is a few requests over urllib rather than a Selenium dependency. Waits are on
conditions (the driver answering, the page setting ``data-ready``), each bounded, never a sleep.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The flags the project runs Chromium with: no sandbox (root in a container), no GPU, no network chatter.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
BOUND = 120.0  # seconds any single wait may take before the test fails (only bounds a hang)


def install() -> tuple[str, str]:
    """Chromium and chromedriver paths, installing them with the project's script when missing."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "browser.sh")], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/browser.sh failed (rc={proc.returncode}):\n{proc.stderr}")
    chromium, driver = proc.stdout.split()[-2:]
    return chromium, driver


class Browser:
    """One WebDriver session on one page."""

    def __init__(self, base: str, session: str) -> None:
        self.base, self.session = base, session

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return _request(method, f"{self.base}/session/{self.session}{path}", body)

    def open(
        self, url: str, *, ready: str = "return document.body && document.body.dataset.ready === '1'"
    ) -> None:
        """Go to ``url`` and wait until ``ready`` holds (by default: the report says it is drawn)."""
        self._call("POST", "/url", {"url": url})
        self.wait_for(ready)

    def run(self, script: str, *args: Any) -> Any:
        return self._call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, script: str) -> Any:
        deadline = time.monotonic() + BOUND
        while True:
            value = self.run(script)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"page condition never held: {script}")
            time.sleep(0.05)  # poll interval of a condition wait, not a guess at how long rendering takes

    def find(self, css: str) -> list[str]:
        found = self._call("POST", "/elements", {"using": "css selector", "value": css})
        return [next(iter(e.values())) for e in found]

    def click(self, css: str) -> None:
        (element,) = self.find(css)
        self._call("POST", f"/element/{element}/click", {})

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._call("GET", "/screenshot")))
        return path

    def resize(self, width: int, height: int) -> None:
        self._call("POST", "/window/rect", {"width": width, "height": height})


def _request(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=BOUND) as resp:
            return json.loads(resp.read() or b"{}").get("value")
    except urllib.error.HTTPError as e:
        raise AssertionError(f"WebDriver {method} {url}: {e.code} {e.read().decode(errors='replace')}") from e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def chromium(
    profile: Path, width: int = 1400, height: int = 1000, *, javascript: bool = True
) -> Iterator[Browser]:
    """A headless Chromium session with a fresh profile directory; everything is stopped afterwards.
    ``javascript=False``: the pages' own scripts do not run (as in a mail client); WebDriver's still do,
    so a test can read the page."""
    binary, driver = install()
    port = _free_port()
    log = profile.parent / "chromedriver.log"
    proc = subprocess.Popen(
        [driver, f"--port={port}", f"--log-path={log}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    session = None
    try:
        deadline = time.monotonic() + BOUND
        while True:  # the driver answers its status endpoint once it listens
            try:
                if _request("GET", f"{base}/status").get("ready"):
                    break
            except (urllib.error.URLError, ConnectionError, AssertionError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromedriver did not start (rc={proc.poll()}); see {log}")
            time.sleep(0.05)
        args = [*CHROMIUM_ARGS, f"--user-data-dir={profile}"]
        if not javascript:
            args.append("--blink-settings=scriptEnabled=false")
        options = {"binary": binary, "args": args}
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}}
        session = _request("POST", f"{base}/session", caps)["sessionId"]
        browser = Browser(base, session)
        browser.resize(width, height)
        yield browser
    finally:
        if session is not None:
            with suppress(urllib.error.URLError, AssertionError):
                _request("DELETE", f"{base}/session/{session}")
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
