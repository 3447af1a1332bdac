"""The engine API fast path answers as the docker CLI does, on real containers: running, created and not
started, exited, and missing. Each form is run both ways — ``engineapi.answer`` (asserted to have answered)
and the CLI through the runner with the fast path off — and the rc, the parsed stdout and the stderr
texts callers look for must agree."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest

from forgelib import engineapi
from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.runner import Result, SubprocessRunner

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

IMAGE = "forgelib/debian:bookworm"
CLI = {engineapi.SWITCH: "0"}


@dataclass(frozen=True)
class Probes:
    prefix: str
    running: str
    created: str
    exited: str
    missing: str

    def name(self, what: str) -> str:
        return f"{self.prefix}-{what}"


@pytest.fixture
def probes(runner: SubprocessRunner, run_id: str) -> Iterator[Probes]:
    prefix = f"eapi-{secrets.token_hex(3)}"
    p = Probes(prefix, f"{prefix}-running", f"{prefix}-created", f"{prefix}-exited", f"{prefix}-missing")
    made: list[str] = []
    label = f"{lab.RUN}={run_id}"
    try:
        for name, argv in (
            (p.running, dk.run(IMAGE, ["sleep", "300"], detach=True, label=label, name=p.running,
                               publish=["127.0.0.1::5432", "6000"])),
            (p.created, dk.create(IMAGE, ["sleep", "300"], label=label, name=p.created)),
            (p.exited, dk.run(IMAGE, ["true"], label=label, name=p.exited)),
        ):  # fmt: skip
            made.append(name)
            runner.run(argv, env=CLI)
        yield p
    finally:
        if made:
            runner.run(dk.rm(made, force=True, volumes=True), env=CLI, check=False)


def both(runner: SubprocessRunner, argv: Sequence[str]) -> tuple[engineapi.Answer, Result]:
    fast = engineapi.answer(argv, 60)
    assert fast is not None, f"the fast path did not answer {argv}"
    return fast, runner.run(argv, env=CLI, check=False)


def agree(fast: engineapi.Answer, cli: Result, *, parse: str = "lines") -> None:
    assert fast.rc == cli.rc, (fast, cli)
    if parse == "json":
        assert json.loads(fast.stdout) == json.loads(cli.stdout)
    elif parse == "json-lines":
        assert [json.loads(x) for x in fast.stdout.splitlines()] == [
            json.loads(x) for x in cli.stdout.splitlines()
        ]
    else:
        assert fast.stdout == cli.stdout
    assert fast.stderr == cli.stderr


def test_inspect_of_containers_in_every_state(runner: SubprocessRunner, probes: Probes) -> None:
    refs = [probes.running, probes.created, probes.exited]
    fast, cli = both(runner, dk.inspect(refs))
    agree(fast, cli, parse="json")
    assert [c["State"]["Status"] for c in json.loads(fast.stdout)] == ["running", "created", "exited"]
    fast, cli = both(runner, dk.inspect(refs, format="{{json .State}}"))
    agree(fast, cli, parse="json-lines")
    # a missing one: the CLI looks among images, networks, volumes... so it answers, and says so
    assert engineapi.answer(dk.inspect([probes.running, probes.missing]), 60) is None
    missing = runner.run(dk.inspect([probes.missing]), check=False)
    assert missing.rc == 1 and "No such object" in missing.stderr


def test_ps_by_label_quiet_and_formatted(runner: SubprocessRunner, probes: Probes, run_id: str) -> None:
    by_run = lab.filters({lab.RUN: run_id})
    for argv in (
        dk.ps(all=True, quiet=True, no_trunc=True, filters=by_run),
        dk.ps(quiet=True, filters=by_run),  # running only, ids cut to 12
        dk.ps(all=True, quiet=True, no_trunc=True, filters=["--filter", "status=exited", *by_run]),
        dk.ps(
            all=True,
            no_trunc=True,
            filters=by_run,
            format='{{.ID}}\t{{.Names}}\t{{.Label "' + lab.RUN + '"}}',
        ),
        dk.ps(all=True, filters=by_run, format="{{.Names}}"),
        dk.ps(all=True, quiet=True, filters=lab.filters({lab.RUN: run_id + "-none"})),
    ):
        fast, cli = both(runner, argv)
        agree(fast, cli)
    fast = engineapi.answer(dk.ps(all=True, quiet=True, no_trunc=True, filters=by_run), 60)
    assert fast is not None and len(fast.stdout.split()) == 3


def test_port_published_unpublished_not_started_and_missing(runner: SubprocessRunner, probes: Probes) -> None:
    for ref, mapping in (
        (probes.running, "5432/tcp"),  # one bind, on 127.0.0.1
        (probes.running, "6000/tcp"),  # on every address: one line per family
        (probes.running, "7000/tcp"),  # not published
        (probes.created, "5432/tcp"),
        (probes.missing, "5432/tcp"),
    ):
        fast, cli = both(runner, dk.port(ref, mapping))
        agree(fast, cli)
    fast, _ = both(runner, dk.port(probes.running, "7000/tcp"))
    assert "No public port" in fast.stderr
    fast, _ = both(runner, dk.port(probes.missing, "5432/tcp"))
    assert "No such container" in fast.stderr and "Error response from daemon" in fast.stderr


def test_image_inspect_found_and_missing(runner: SubprocessRunner) -> None:
    missing = f"forgelib-no-such-image:{secrets.token_hex(3)}"
    for refs in ([IMAGE], [missing], [missing, IMAGE, missing + "b"]):
        fast, cli = both(runner, dk.inspect(refs, kind="image"))
        agree(fast, cli, parse="json")
    fast, _ = both(runner, dk.inspect([missing], kind="image"))
    assert fast.rc == 1 and "No such image" in fast.stderr
    for fmt in engineapi.IMAGE_FORMATS:
        for refs in ([IMAGE, "forgelib/postgres:15"], [missing, IMAGE]):
            fast, cli = both(runner, dk.inspect(refs, kind="image", format=fmt))
            agree(fast, cli)


def test_start_pause_unpause_in_every_state(runner: SubprocessRunner, probes: Probes, run_id: str) -> None:
    # a mutation is compared on twins: one container changed by the CLI, its twin by the fast path
    label = f"{lab.RUN}={run_id}"
    twins = [probes.name("twin-a"), probes.name("twin-b")]
    try:
        for twin in twins:
            runner.run(dk.create(IMAGE, ["sleep", "300"], label=label, name=twin), env=CLI)
        cli = runner.run(dk.start([twins[0]]), env=CLI, check=False)
        fast = engineapi.answer(dk.start([twins[1]]), 60)
        assert (
            fast is not None
            and (fast.rc, fast.stdout) == (cli.rc, twins[1] + "\n")
            and cli.stdout == twins[0] + "\n"
        )
        for verb in (dk.pause, dk.pause, dk.unpause, dk.unpause):  # the second of each fails
            cli = runner.run(verb([twins[0]]), env=CLI, check=False)
            fast = engineapi.answer(verb([twins[1]]), 60)
            assert fast is not None and fast.rc == cli.rc
            assert fast.stdout.replace(twins[1], "X") == cli.stdout.replace(twins[0], "X")
            ids = {t: json.loads(runner.run(dk.inspect([t]), env=CLI).stdout)[0]["Id"] for t in twins}
            assert fast.stderr.replace(ids[twins[1]], "X") == cli.stderr.replace(ids[twins[0]], "X")
    finally:
        runner.run(dk.rm(twins, force=True, volumes=True), env=CLI, check=False)
    # starting one already running, a missing one, and one that exited; pausing one not started
    fast, cli = both(runner, dk.start([probes.running, probes.missing, probes.missing + "2"]))
    agree(fast, cli)
    assert "No such container" in fast.stderr and "failed to start containers" in fast.stderr
    fast, cli = both(runner, dk.pause([probes.created, probes.missing]))
    agree(fast, cli)
    assert "is not running" in fast.stderr
    fast, cli = both(runner, dk.start([probes.exited]))
    agree(fast, cli)


def test_the_runner_logs_a_fast_call_as_it_logs_the_cli(
    runner: SubprocessRunner, probes: Probes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="forgelib.runner")
    argv = dk.inspect([probes.running], format="{{json .State}}")
    res = runner.run(argv)
    assert json.loads(res.stdout)["Status"] == "running" and res.argv == tuple(argv)
    lines = [r.getMessage() for r in caplog.records]
    shown = " ".join(argv)
    assert f"served by the engine API: {shown}" in lines
    assert any(line.startswith("rc=0 in ") and line.endswith(f"s: {shown}") for line in lines)


def test_rm_and_network_disconnect_on_twins_and_missing(
    runner: SubprocessRunner, probes: Probes, run_id: str
) -> None:
    label = f"{lab.RUN}={run_id}"
    twins = [probes.name("rm-a"), probes.name("rm-b")]
    try:
        for twin in twins:
            runner.run(dk.run(IMAGE, ["sleep", "300"], detach=True, label=label, name=twin), env=CLI)
        ids = {t: json.loads(runner.run(dk.inspect([t]), env=CLI).stdout)[0]["Id"] for t in twins}

        def same(verb: Callable[[str], list[str]]) -> engineapi.Answer:
            cli = runner.run(verb(twins[0]), env=CLI, check=False)
            fast = engineapi.answer(verb(twins[1]), 60)
            assert fast is not None and fast.rc == cli.rc, (fast, cli)
            for a, b in ((fast.stdout, cli.stdout), (fast.stderr, cli.stderr)):
                assert a.replace(twins[1], "X").replace(ids[twins[1]], "X") == b.replace(
                    twins[0], "X"
                ).replace(ids[twins[0]], "X")
            return fast

        # off the default network, then again (not connected any more)
        assert same(lambda t: dk.network_disconnect("bridge", t, force=True)).rc == 0
        assert same(lambda t: dk.network_disconnect("bridge", t, force=True)).rc == 1
        refused = same(lambda t: dk.rm([t]))  # running: not without --force
        assert refused.rc == 1 and "Error response from daemon" in refused.stderr
        assert same(lambda t: dk.rm([t], force=True, volumes=True)).rc == 0
        gone = same(lambda t: dk.rm([t], force=True, volumes=True))  # gone already: fine, and said
        assert gone.rc == 0 and "No such container" in gone.stderr
    finally:
        runner.run(dk.rm(twins, force=True, volumes=True), env=CLI, check=False)
    for argv in (
        dk.rm([probes.missing, probes.missing + "2"]),
        dk.rm([probes.missing], force=True, volumes=True),
        dk.network_disconnect("bridge", probes.missing, force=True),
        dk.network_disconnect(probes.missing, probes.running, force=True),
    ):
        fast, cli = both(runner, argv)
        agree(fast, cli)


def test_stats_memory_of_containers_in_every_state_and_a_missing_one(
    runner: SubprocessRunner, probes: Probes
) -> None:
    # an idle `sleep` keeps its memory: the two answers, a moment apart, print the same figures
    refs = [probes.running, probes.created, probes.exited]
    fast, cli = both(runner, dk.stats(refs, no_stream=True, format=engineapi.MEMORY_FORMAT))
    agree(fast, cli)
    used = [line.split("\t")[1].split(" / ")[0] for line in fast.stdout.splitlines()]
    assert used[0] not in ("0B", "--") and used[1:] == ["0B", "0B"], fast.stdout
    argv = dk.stats([probes.running, probes.missing], no_stream=True, format=engineapi.MEMORY_FORMAT)
    agree(*both(runner, argv))
