"""Signal-safe teardown: the live-stack registry, the first/second/third signal, the stop-aware runner."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from forgelib.errors import EXIT_INTERRUPTED, CommandError, Interrupted
from forgelib.runner import SubprocessRunner
from forgelib.stacks.live import LiveStacks, StopState, interruptible
from forgelib.testing import FakeRunner


class Recorder:
    """Teardown callables that record (name, graceful) and can misbehave on demand."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, name: str, action: Callable[[bool], None] | None = None) -> Callable[[bool], object]:
        def teardown(graceful: bool) -> None:
            self.calls.append((name, graceful))
            if action is not None:
                action(graceful)

        return teardown


def _sigint(graceful: bool) -> None:
    os.kill(os.getpid(), signal.SIGINT)


# ------------------------------------------------------------------------------------------ registry


def test_registry_add_discard_names() -> None:
    stacks, rec = LiveStacks(), Recorder()
    stacks.add("b", rec("b"))
    stacks.add("a", rec("a"))
    stacks.discard("b")
    stacks.discard("never-added")
    assert stacks.names() == ["a"]


def test_registry_is_thread_safe() -> None:
    stacks, rec = LiveStacks(), Recorder()

    def worker(i: int) -> None:
        for j in range(200):
            stacks.add(f"s{i}.{j}", rec("x"))
            if j % 2:
                stacks.discard(f"s{i}.{j}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(stacks.names()) == 8 * 100


def test_teardown_all_tears_down_everything_and_closes() -> None:
    stacks, rec = LiveStacks(), Recorder()
    for n in ("b", "a", "c"):
        stacks.add(n, rec(n))
    report = stacks.teardown_all()
    assert rec.calls == [("a", True), ("b", True), ("c", True)]
    assert report.removed == ["a", "b", "c"] and not report.failed and not report.hurried
    assert stacks.names() == []
    with pytest.raises(Interrupted, match="not starting stack d"):
        stacks.add("d", rec("d"))


def test_one_failing_teardown_does_not_leave_the_others_up() -> None:
    stacks, rec = LiveStacks(), Recorder()

    def boom(graceful: bool) -> None:
        raise CommandError(["docker", "compose", "down"], 1, "", "daemon gone")

    stacks.add("a", rec("a", boom))
    stacks.add("b", rec("b"))
    report = stacks.teardown_all()
    assert report.removed == ["b"]
    assert "docker compose down" in report.failed["a"]
    assert stacks.names() == []


def test_interrupt_during_graceful_teardown_redoes_it_hurried() -> None:
    stacks, rec = LiveStacks(), Recorder()

    def interrupt_when_graceful(graceful: bool) -> None:
        if graceful:
            raise KeyboardInterrupt

    stacks.add("a", rec("a", interrupt_when_graceful))
    stacks.add("b", rec("b"))
    report = stacks.teardown_all()
    assert rec.calls == [("a", True), ("a", False), ("b", False)]
    assert report.hurried and report.removed == ["a", "b"]


def test_interrupt_during_hurried_teardown_abandons_only_that_stack() -> None:
    stacks, rec = LiveStacks(), Recorder()

    def always_interrupt(graceful: bool) -> None:
        raise KeyboardInterrupt

    stacks.add("a", rec("a", always_interrupt))
    stacks.add("b", rec("b"))
    report = stacks.teardown_all(graceful=False)
    assert rec.calls == [("a", False), ("b", False)]
    assert report.failed == {"a": "abandoned: interrupted again"} and report.removed == ["b"]


class _FlakyDown:
    """A teardown whose first call fails (a second Ctrl-C killed its graceful `down`); later ones work."""

    def __init__(self) -> None:
        self.calls: list[bool] = []

    def __call__(self, graceful: bool) -> None:
        self.calls.append(graceful)
        if len(self.calls) == 1:
            raise CommandError(["docker", "compose", "down"], -9, stderr="killed")


def test_teardown_runs_once_however_many_ask() -> None:
    stacks, rec = LiveStacks(), Recorder()
    stacks.add("a", rec("a"))
    assert stacks.teardown("a") is None and stacks.teardown("a") is None  # the second finds it gone
    assert rec.calls == [("a", True)] and stacks.names() == []


def test_a_second_caller_waits_for_the_teardown_in_flight_then_finds_it_gone() -> None:
    stacks, rec = LiveStacks(), Recorder()
    entered, release = threading.Event(), threading.Event()

    def slow(graceful: bool) -> None:
        entered.set()
        assert release.wait(60)

    stacks.add("a", rec("a", slow))
    worker = threading.Thread(target=stacks.teardown, args=("a",))
    worker.start()
    assert entered.wait(60)
    results: list[str | None] = []
    sweeper = threading.Thread(target=lambda: results.append(stacks.teardown("a", False)))
    sweeper.start()
    release.set()
    worker.join()
    sweeper.join()
    assert rec.calls == [("a", True)] and results == [None]


def test_a_teardown_failing_while_stopping_stays_live_for_the_hurried_sweep() -> None:
    stacks, down = LiveStacks(), _FlakyDown()
    stacks.add("a", down)
    stacks.closed = True  # a stop is under way
    assert "killed" in (stacks.teardown("a") or "")
    assert stacks.names() == ["a"]  # not forgotten
    report = stacks.teardown_all(graceful=False)
    assert report.removed == ["a"] and not report.failed and down.calls == [True, False]


def test_a_teardown_failing_outside_a_stop_is_reported_and_left_to_the_reaper() -> None:
    stacks, down = LiveStacks(), _FlakyDown()
    stacks.add("a", down)
    assert "killed" in (stacks.teardown("a") or "")
    assert stacks.names() == []  # its labels let `forge reap` find it later
    assert stacks.teardown("a") is None and down.calls == [True]  # nothing left to do twice


def test_a_started_stack_is_registered_even_after_a_stop() -> None:
    stacks, rec = LiveStacks(), Recorder()
    stacks.teardown_all()
    with pytest.raises(Interrupted):
        stacks.add("new", rec("new"))
    stacks.add("up-already", rec("up-already"), started=True)
    assert stacks.names() == ["up-already"]


# ------------------------------------------------------------------------------------ the context manager


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_first_signal_stops_tears_down_gracefully_and_raises_interrupted(sig: signal.Signals) -> None:
    stacks, rec = LiveStacks(), Recorder()
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    reached_after_kill = False
    with pytest.raises(Interrupted) as info, interruptible(stacks) as stop:
        stacks.add("trial-0", rec("trial-0"))
        stacks.add("trial-1", rec("trial-1"))
        os.kill(os.getpid(), sig)
        reached_after_kill = True
    assert not reached_after_kill
    assert stop.requested and not stop.hurry
    assert rec.calls == [("trial-0", True), ("trial-1", True)]
    assert info.value.exit_code == EXIT_INTERRUPTED == 130
    assert str(info.value) == f"interrupted by {sig.name}; tore down 2 live stack(s): trial-0, trial-1"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_second_signal_skips_graceful_waits_but_still_removes() -> None:
    stacks, rec = LiveStacks(), Recorder()
    with pytest.raises(Interrupted, match="tore down 2 live stack"), interruptible(stacks) as stop:
        stacks.add("a", rec("a", lambda graceful: _sigint(graceful) if graceful else None))
        stacks.add("b", rec("b"))
        os.kill(os.getpid(), signal.SIGINT)
    assert stop.hurry
    assert rec.calls == [("a", True), ("a", False), ("b", False)]


def test_third_signal_is_ignored_while_hurrying(capsys: pytest.CaptureFixture[str]) -> None:
    stacks, rec = LiveStacks(), Recorder()
    with pytest.raises(Interrupted, match="tore down 2 live stack"), interruptible(stacks):
        stacks.add("a", rec("a", _sigint))  # graceful: 2nd signal; hurried: 3rd signal, ignored
        stacks.add("b", rec("b"))
        os.kill(os.getpid(), signal.SIGINT)
    assert rec.calls == [("a", True), ("a", False), ("b", False)]
    assert "SIGKILL leaves them to `forge reap`" in capsys.readouterr().err


def test_a_deferring_main_thread_records_signals_and_raises_only_where_it_chooses() -> None:
    """While ``defer`` is set (the executor inside concurrent.futures' ``wait``), the handler raises nothing:
    both signals are recorded (the second still hurries) and the main thread raises at its own check."""
    stacks, rec = LiveStacks(), Recorder()
    reached = []
    with pytest.raises(Interrupted, match="tore down 1 live stack"), interruptible(stacks) as stop:
        stacks.add("a", rec("a"))
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            reached.append(stop.signals)  # no KeyboardInterrupt cut this line short
        assert not stop.defer
        if stop.requested:
            raise KeyboardInterrupt
    assert reached == [2]
    assert rec.calls == [("a", False)]  # recorded as a hurry: the sweep skips graceful waits


def test_no_new_stack_after_a_stop_request() -> None:
    stacks, rec = LiveStacks(), Recorder()
    with pytest.raises(Interrupted), interruptible(stacks) as stop:
        with contextlib.suppress(KeyboardInterrupt):  # code that swallowed it still cannot start anything
            os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
        with pytest.raises(Interrupted):
            stop.check()
        stacks.add("late", rec("late"))
    assert rec.calls == []


def test_normal_exit_tears_nothing_down() -> None:
    stacks, rec = LiveStacks(), Recorder()
    with interruptible(stacks) as stop:
        stacks.add("kept", rec("kept"))  # e.g. forge provision --keep
    assert rec.calls == [] and stacks.names() == ["kept"] and not stop.requested


def test_any_error_tears_down_and_propagates_unchanged() -> None:
    stacks, rec = LiveStacks(), Recorder()
    with pytest.raises(ValueError, match="bug"), interruptible(stacks):
        stacks.add("a", rec("a"))
        raise ValueError("bug")
    assert rec.calls == [("a", True)]


def test_failed_teardown_points_at_forge_reap() -> None:
    stacks = LiveStacks()

    def fail(graceful: bool) -> None:
        raise CommandError(["docker", "compose", "down"], 1, "", "nope")

    with pytest.raises(Interrupted, match=r"could not tear down a: .*forge reap"), interruptible(stacks):
        stacks.add("a", fail)
        raise KeyboardInterrupt


def test_outside_the_main_thread_no_handlers_but_still_teardown() -> None:
    stacks, rec = LiveStacks(), Recorder()
    seen: list[BaseException] = []
    before = signal.getsignal(signal.SIGINT)

    def body() -> None:
        try:
            with interruptible(stacks):
                assert signal.getsignal(signal.SIGINT) is before
                stacks.add("a", rec("a"))
                raise KeyboardInterrupt
        except BaseException as e:  # noqa: BLE001 - handed to the main thread for asserting
            seen.append(e)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert isinstance(seen[0], Interrupted) and rec.calls == [("a", True)]


def test_sigterm_in_a_real_process_exits_130_after_teardown(tmp_path: Path) -> None:
    marker = tmp_path / "torn-down"
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from forgelib.errors import Interrupted
        from forgelib.stacks.live import LiveStacks, interruptible
        stacks = LiveStacks()
        try:
            with interruptible(stacks):
                stacks.add("s", lambda graceful: Path({str(marker)!r}).write_text(str(graceful)))
                print("ready", flush=True)
                time.sleep(60)
        except Interrupted as e:
            print(e, file=sys.stderr)
            sys.exit(e.exit_code)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)  # a hang fails here; the child's own sleep is 60 s
    assert proc.returncode == 130, err
    assert marker.read_text() == "True"
    assert "interrupted by SIGTERM; tore down 1 live stack(s): s" in err


# ----------------------------------------------------------------------------------- stop-aware runner


def test_guard_refuses_launching_after_a_stop_but_lets_teardown_through() -> None:
    fake = FakeRunner()
    fake.expect("docker")
    state = StopState()
    runner = state.guard(fake)
    runner.run(["docker", "compose", "-p", "x", "up", "-d"], timeout=5, tag="up")  # before the stop: passes
    state.request("SIGINT")
    for verb in ("up", "exec", "run", "cp", "start", "restart", "create"):
        with pytest.raises(Interrupted, match=f"not running `{verb}`"):
            runner.run(["docker", "compose", "-p", "x", verb, "svc"], timeout=5, tag=verb)
    for verb in ("down", "logs", "ps", "kill", "stop", "rm", "port"):
        runner.run(["docker", "compose", "-p", "x", verb], timeout=5, tag=verb)
    runner.run(["docker", "network", "rm", "n"], timeout=5)
    passed = [c.tag or c.argv[1] for c in fake.calls]
    assert passed == ["up", "down", "logs", "ps", "kill", "stop", "rm", "port", "network"]
    assert all(c.timeout == 5 for c in fake.calls)


def test_a_launch_failing_once_a_stop_is_requested_is_an_interruption_and_a_teardown_is_not() -> None:
    fake = FakeRunner()
    state = StopState()
    fake.expect("docker", "build", rc=-9, side_effect=lambda call: state.request("SIGINT"))
    fake.expect("docker", "exec", rc=-9, side_effect=lambda call: state.request("SIGINT"))
    fake.expect("docker", "compose", "down", rc=1)
    runner = state.guard(fake)
    with pytest.raises(Interrupted, match="`build` was stopped") as err:
        runner.run(["docker", "build", "."], tag="build")
    assert isinstance(err.value.__cause__, CommandError)
    state2 = StopState()
    runner2 = state2.guard(FakeRunner(expectations=[*fake.expectations]))
    fake.expectations[1].side_effect = lambda call: state2.request("SIGINT")
    with pytest.raises(Interrupted):  # check=False too: its rc is the kill's, not the command's
        runner2.run(["docker", "exec", "c", "true"], tag="exec", check=False)
    with pytest.raises(CommandError) as down:  # not a launch: its failure is its own, reported as such
        runner.run(["docker", "compose", "down"], tag="down")
    assert not isinstance(down.value, Interrupted)


# ------------------------------------------------------------------------------ killing in-flight launches


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    """Block until ``condition()`` holds: a condition, not a sleep racing a thread (fails after 60 s)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def test_a_stop_kills_the_guarded_runners_launches_by_tag_and_the_second_its_downs(tmp_path: Path) -> None:
    real = SubprocessRunner(default_timeout=120)
    state = StopState()
    runner = state.guard(real)
    errors: dict[str, CommandError | Interrupted] = {}

    def run(tag: str) -> None:
        try:
            runner.run(["sleep", "60"], tag=tag)
        except (CommandError, Interrupted) as e:
            errors[tag] = e

    threads = {tag: threading.Thread(target=run, args=(tag,)) for tag in ("up", "exec", "down", "logs")}
    for t in threads.values():
        t.start()
    _wait_for(lambda: len(real.running()) == 4, "four children running")
    pids = dict((tag, pid) for pid, tag in real.running())

    assert sorted(state.request("SIGINT")) == sorted([pids["up"], pids["exec"]])
    threads["up"].join()
    threads["exec"].join()
    # A killed launch is an interruption (its caller must not blame what it ran), caused by the kill.
    for tag in ("up", "exec"):
        err = errors[tag]
        assert isinstance(err, Interrupted) and isinstance(err.__cause__, CommandError), err
        assert err.__cause__.rc == -signal.SIGKILL
    assert sorted(tag for _, tag in real.running()) == ["down", "logs"]  # teardown and logs run on

    assert state.request("SIGINT") == [pids["down"]]  # the second signal: the graceful down goes too
    threads["down"].join()
    assert [tag for _, tag in real.running()] == ["logs"]
    real.kill_tagged(["logs"])
    threads["logs"].join()
    assert real.running() == []
