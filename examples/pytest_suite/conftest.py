"""Helpers of this suite (nothing forgelib-specific: the stacks come from the plugin's ``forge_stack``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: Any


def request(url: str, method: str = "GET", payload: Any = None) -> Response:
    """One JSON request; an HTTP error status is a response too (tests assert on it)."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return Response(r.status, dict(r.headers), json.load(r))
    except urllib.error.HTTPError as e:
        return Response(e.code, dict(e.headers), json.loads(e.read() or b"null"))


@pytest.fixture
def http() -> Any:
    return request
