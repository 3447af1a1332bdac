from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .fakes import FakeBackend, good_answer


@pytest.fixture
def fake_backend() -> Callable[..., FakeBackend]:
    def make(answer: Any = good_answer, **kw: Any) -> FakeBackend:
        return FakeBackend(answer, **kw)

    return make
