"""The one seam every command goes through, on real small subprocesses: timeouts kill the whole process
group, stdin from a file, stdout to a file, bounded tails, a missing program, redaction, tagged children."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from forgelib.docker.labels import proc_stat
from forgelib.errors import TAIL_LINES, CommandError, CommandTimeout, ProgramNotFound
from forgelib.runner import FILE_TAIL, REDACTED, SubprocessRunner, redact, secret_values

PY = sys.executable


def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    # sh starts a grandchild that would outlive it, records its pid, and waits (sh starts in milliseconds,
    # so even a busy machine gets there well within the timeout).
    script = f"sleep 120 & echo $! > {pidfile}; wait"
    with pytest.raises(CommandTimeout) as info:
        SubprocessRunner().run(["sh", "-c", script], timeout=5)
    assert info.value.rc is None and "timed out after 5s (killed)" in str(info.value)
    # The group's SIGKILL was sent; wait for the kernel to finish it.
    _gone(int(pidfile.read_text()), "the grandchild survived the timeout: the group was not killed")


def test_the_child_runs_in_its_own_session() -> None:
    out = SubprocessRunner().run([PY, "-c", "import os; print(os.getsid(0), os.getpgrp(), os.getpid())"])
    sid, pgrp, pid = map(int, out.stdout.split())
    assert sid == pgrp == pid != os.getsid(0)  # a Ctrl-C to our terminal's group does not reach it


def test_stdin_streams_from_a_file_and_stdout_goes_to_a_file(tmp_path: Path) -> None:
    src, dest = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes(b"line\n" * 100_000)
    r = SubprocessRunner().run(
        [PY, "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"], stdin=src, stdout_path=dest
    )
    assert r.stdout == "" and dest.read_bytes() == b"LINE\n" * 100_000


def test_stderr_goes_to_a_file_and_the_result_and_error_keep_its_tail(tmp_path: Path) -> None:
    dest = tmp_path / "err.txt"
    script = "import sys\nfor i in range(100_000): sys.stderr.write(f'err {i}\\n')\nsys.exit(3)"
    r = SubprocessRunner().run([PY, "-c", script], stderr_path=dest, check=False)
    whole = dest.read_text()
    assert r.rc == 3 and whole.splitlines() == [f"err {i}" for i in range(100_000)]
    assert len(r.stderr) == FILE_TAIL and whole.endswith(r.stderr)
    with pytest.raises(CommandError) as e:
        SubprocessRunner().run([PY, "-c", script], stderr_path=dest)
    assert e.value.stderr_tail.splitlines()[-1] == "err 99999" and len(e.value.stderr_tail) <= FILE_TAIL


def test_stdout_and_stderr_to_one_path_interleave_in_order(tmp_path: Path) -> None:
    dest = tmp_path / "both.txt"
    script = (
        "import sys\nfor i in range(3):\n"
        " print(f'out {i}', flush=True); print(f'err {i}', file=sys.stderr, flush=True)"
    )
    r = SubprocessRunner().run([PY, "-c", script], stdout_path=dest, stderr_path=dest)
    want = [f"{s} {i}" for i in range(3) for s in ("out", "err")]
    assert dest.read_text().splitlines() == want and r.stdout == ""  # neither stream clobbered the other


def test_input_text_and_not_both() -> None:
    r = SubprocessRunner().run([PY, "-c", "import sys; print(sys.stdin.read()[::-1])"], input="abc")
    assert r.stdout == "cba\n" and r.rc == 0
    with pytest.raises(ValueError, match="stdin or input"):
        SubprocessRunner().run(["true"], stdin=Path("/dev/null"), input="x")


def test_a_failure_carries_rc_and_bounded_tails() -> None:
    script = "import sys\nfor i in range(500): print('out', i); print('err', i, file=sys.stderr)\nsys.exit(3)"
    with pytest.raises(CommandError) as info:
        SubprocessRunner().run([PY, "-c", script])
    e = info.value
    assert e.rc == 3
    assert e.stderr_tail.splitlines()[-1] == "err 499" and "err 479" not in e.stderr_tail
    assert len(e.stderr_tail.splitlines()) == TAIL_LINES + 1  # the tail and a "[... N earlier lines cut]"
    assert "480 earlier lines cut" in e.stderr_tail
    assert len(str(e)) < 2000  # never megabytes of output in a message
    r = SubprocessRunner().run([PY, "-c", script], check=False)
    assert r.rc == 3 and r.stdout.count("\n") == 500  # check=False: the whole output, no error


def test_a_missing_program_names_itself_and_the_fix() -> None:
    with pytest.raises(ProgramNotFound, match="'no-such-program-forge' was not found on PATH"):
        SubprocessRunner().run(["no-such-program-forge", "x"])
    with pytest.raises(ProgramNotFound, match="run `forge engine`"):
        SubprocessRunner().run(["docker", "ps"], env={"PATH": "/nonexistent"})


def test_secrets_are_redacted_from_argv_output_and_the_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="forgelib.runner")
    runner = SubprocessRunner(secrets={"hunter2"})
    script = "import sys; print('pw=hunter2 tok=t0k3n-xyz', file=sys.stderr); sys.exit(1)"
    with pytest.raises(CommandError) as info:
        runner.run([PY, "-c", script, "--password", "hunter2"], secrets=["t0k3n-xyz"])
    text = str(info.value)
    assert "hunter2" not in text and "t0k3n-xyz" not in text
    assert f"pw={REDACTED} tok={REDACTED}" in text and f"--password {REDACTED}" in text
    assert "hunter2" not in caplog.text and "t0k3n-xyz" not in caplog.text and REDACTED in caplog.text


def test_redaction_is_of_whole_values_not_parts_of_names() -> None:
    # A password "app" must not turn the service app-db into "***-db", yet PGPASSWORD=app is hidden.
    assert redact("service app-db: PGPASSWORD=app postgres://u:app@h", ["app"]) == (
        "service app-db: PGPASSWORD=*** postgres://u:***@h"
    )
    assert redact("x", ["", "y"]) == "x"


def test_secret_values_pick_secret_names() -> None:
    env = {"POSTGRES_PASSWORD": "pw", "API_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "k", "POSTGRES_USER": "app"}
    assert secret_values(env) == {"pw", "t", "k"}
    assert secret_values(None) == set() and secret_values({"DB_PASSWORD": ""}) == set()


def test_running_children_are_tracked_by_tag_and_killed_by_tag() -> None:
    runner = SubprocessRunner(default_timeout=120)
    errors: list[CommandError] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        try:
            runner.run(["sleep", "60"], tag="exec")
        except CommandError as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(60)
    while not runner.running():  # the child is registered right after it starts
        t.join(0.01)
    ((pid, tag),) = runner.running()
    assert tag == "exec"
    assert runner.kill_tagged(["up", "down"]) == []  # other tags: untouched
    assert runner.kill_tagged(["exec"]) == [pid]
    t.join(60)
    assert not t.is_alive() and errors[0].rc == -9 and runner.running() == []


def _gone(pid: int, why: str) -> None:
    """Wait for ``pid`` to be gone (or a zombie): a condition, bounded at 60 s on a busy machine."""
    deadline = time.monotonic() + 60
    while proc_stat(pid) is not None:
        assert time.monotonic() < deadline, why
        time.sleep(0.01)


def test_a_tagged_kill_kills_the_whole_process_group(tmp_path: Path) -> None:
    # What a stop (Ctrl-C) does to an in-flight launch: `docker compose up` has children of its own, and a
    # kill of the leader alone would leave them running (and holding its output pipes: `run` would hang).
    pidfile = tmp_path / "grandchild.pid"
    script = f"sleep 300 & echo $! > {pidfile}.new && mv {pidfile}.new {pidfile}; wait"
    runner = SubprocessRunner(default_timeout=600)
    errors: list[CommandError] = []

    def run() -> None:
        try:
            runner.run(["sh", "-c", script], tag="up")
        except CommandError as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 60
    # The grandchild has started (the pid file appears whole: mv) and the runner has registered its leader:
    # the child can write the file before the thread that started it gets to register it.
    while not (pidfile.exists() and runner.running()):
        assert time.monotonic() < deadline and t.is_alive(), "sh never started its grandchild"
        time.sleep(0.01)
    grandchild = int(pidfile.read_text())
    ((leader, _),) = runner.running()
    assert runner.kill_tagged(["up"]) == [leader]
    t.join(60)
    assert not t.is_alive(), "run() still waits: the grandchild holds its pipes (only the leader was killed)"
    assert errors[0].rc == -9 and runner.running() == []
    _gone(grandchild, "the grandchild survived the tagged kill: the group was not killed")


def test_a_kill_requested_while_a_child_starts_still_kills_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stop's kill lands between the runner deciding to start `exec` and the child being registered:
    # the child must still die (else a Ctrl-C at that moment leaves a launch running to its timeout).
    from forgelib import runner as runner_mod

    runner = SubprocessRunner(default_timeout=120)
    real_popen = subprocess.Popen

    def popen_after_a_kill(*args: Any, **kw: Any) -> subprocess.Popen[bytes]:
        assert runner.kill_tagged(["exec"]) == []  # nothing registered yet
        return real_popen(*args, **kw)

    monkeypatch.setattr(runner_mod.subprocess, "Popen", popen_after_a_kill)
    with pytest.raises(CommandError) as info:
        runner.run(["sleep", "60"], tag="exec")
    assert info.value.rc == -9
    monkeypatch.setattr(runner_mod.subprocess, "Popen", real_popen)
    assert runner.run(["true"], tag="exec").rc == 0  # a command started after the request runs


# The stderr of a psql run on a pg_dump file that failed half way, and its stdout (the preamble's rows).
PSQL_STDERR = """psql:<stdin>:20: NOTICE:  table "w" does not exist, skipping
psql:<stdin>:41: ERROR:  relation "widgets" does not exist
LINE 1: insert into widgets values (1, 'a');
                    ^
HINT:  Perhaps you meant to reference the table "public.widget".
psql:<stdin>:42: ERROR:  current transaction is aborted
"""
PSQL_STDOUT = " set_config \n------------\n \n(1 row)\n"


@pytest.mark.parametrize(
    ("stderr", "stdout", "cause"),
    [
        (
            PSQL_STDERR,
            PSQL_STDOUT,
            'psql:<stdin>:41: ERROR:  relation "widgets" does not exist '
            "LINE 1: insert into widgets values (1, 'a'); ^ "
            'HINT: Perhaps you meant to reference the table "public.widget".',
        ),
        ('psql: error: connection to server failed: FATAL:  role "x" does not exist\n', "", None),
        ("something went wrong\nfinal words\n", "ignored", "final words"),
        ("", "only stdout\n", "only stdout"),
        ("", "", "(no output)"),
    ],
)
def test_the_cause_is_the_first_error_line_and_its_context(
    stderr: str, stdout: str, cause: str | None
) -> None:
    from forgelib.errors import cause_of

    assert cause_of(stderr, stdout) == (cause or stderr.strip())


def test_a_failed_exec_reads_cause_first_then_the_short_command() -> None:
    from forgelib.errors import ServiceCommandError

    argv = [
        "docker",
        "compose",
        "--project-name",
        "x" * 60,
        "--file",
        "/a/" + "b" * 200,
        "exec",
        "-T",
        "app-db",
    ]
    e = ServiceCommandError(
        CommandError([*argv, "psql", "-q"], 3, PSQL_STDOUT, PSQL_STDERR), "psql", "app-db"
    )
    assert str(e).startswith('psql:<stdin>:41: ERROR:  relation "widgets" does not exist')
    assert str(e).endswith("(`psql` in service `app-db`, rc 3)")
    assert "docker compose" not in str(e) and "set_config" not in str(e)
    assert isinstance(e, CommandError) and e.rc == 3 and "docker compose" in e.full  # all kept for the files
