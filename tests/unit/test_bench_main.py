"""``python -m benchmarks``'s argument routing (benchmarks/__main__.py): which benchmark modules' ``main``
get called, with which arguments; no benchmark runs (the module table is faked)."""

from __future__ import annotations

import types
from typing import Any

import pytest

import benchmarks.__main__ as bm

NAMES = ["cluster", "digest", "overhead"]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    seen: list[tuple[str, list[str]]] = []

    def load(module: str) -> Any:
        name = module.removeprefix("benchmarks.").removesuffix("_bench")
        assert module == f"benchmarks.{name}_bench"

        def main(argv: list[str]) -> None:
            seen.append((name, list(argv)))
            if "--bad" in argv:
                raise SystemExit(2)  # what argparse does after printing its usage

        return types.SimpleNamespace(main=main)

    monkeypatch.setattr(bm, "available", lambda: NAMES)
    monkeypatch.setattr(bm.importlib, "import_module", load)
    return seen


def test_one_name_gets_the_remaining_arguments(calls: list[tuple[str, list[str]]]) -> None:
    assert bm.main(["cluster", "--rounds", "3", "--trials", "4"]) == 0
    assert calls == [("cluster", ["--rounds", "3", "--trials", "4"])]


def test_an_argument_that_cannot_be_a_name_goes_to_the_benchmark_before_it(
    calls: list[tuple[str, list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    # `python -m benchmarks mysql 5`: the 5 is the benchmark's, not a second name
    assert bm.main(["digest", "5"]) == 0
    assert bm.main(["cluster", "8,150", "--rounds", "2"]) == 0
    assert calls == [("digest", ["5"]), ("cluster", ["8,150", "--rounds", "2"])]
    assert bm.main(["5"]) == 2 and bm.main(["overhead", "digest", "5"]) == 2  # whose is it?
    assert calls == [("digest", ["5"]), ("cluster", ["8,150", "--rounds", "2"])]
    assert "name exactly one" in capsys.readouterr().err


def test_several_names_run_in_order_without_arguments(calls: list[tuple[str, list[str]]]) -> None:
    assert bm.main(["overhead", "digest"]) == 0
    assert calls == [("overhead", []), ("digest", [])]


def test_no_name_runs_every_benchmark(calls: list[tuple[str, list[str]]]) -> None:
    assert bm.main([]) == 0
    assert calls == [(n, []) for n in NAMES]


def test_options_with_several_names_or_none_are_refused(
    calls: list[tuple[str, list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert bm.main(["overhead", "digest", "--rounds", "3"]) == 2
    assert bm.main(["--rounds", "3"]) == 2
    assert calls == []
    assert "name exactly one" in capsys.readouterr().err


def test_unknown_name_exits_2_with_the_list(
    calls: list[tuple[str, list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert bm.main(["overhead", "nope", "--rounds", "3"]) == 2
    assert calls == []
    err = capsys.readouterr().err
    assert "unknown benchmark(s): nope" in err and "cluster, digest, overhead" in err


def test_list_prints_the_names(
    calls: list[tuple[str, list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert bm.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == NAMES
    assert calls == []


def test_a_usage_error_fails_that_benchmark_without_a_traceback(
    calls: list[tuple[str, list[str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert bm.main(["digest", "--bad"]) == 1
    err = capsys.readouterr().err
    assert "== digest == FAILED: 2" in err and "Traceback" not in err
