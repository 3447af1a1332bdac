from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from forgelib.docker.compose import ComposeProject
from forgelib.docker.resolved import ResolvedConfig
from forgelib.errors import CommandError, CommandTimeout
from forgelib.grading.checks import ReadOnce, evaluate, read_argv
from forgelib.kinds.postgres.client import postgres_credentials
from forgelib.run.oracle import effective_timeout, run_oracle
from forgelib.runner import FILE_TAIL, Result
from forgelib.spec.models import Check, Oracle
from forgelib.testing import FakeRunner

from .fakes import FakeStack, make_task, ok


def stack_answering(
    out: str = "", rc: int = 0, stderr: str = "", raises: Exception | None = None
) -> FakeStack:
    def answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        if raises is not None:
            raise raises
        return ok(out, rc, stderr)

    return FakeStack(answer)


ENV = ResolvedConfig.of(make_task().environment.compose)  # stands in for the resolved compose config


def test_file_check_cats_the_file() -> None:
    st = stack_answering("baseline\n")
    c = Check("f", "file", {"service": "runner", "path": "/work/out.txt", "equals": "baseline"})
    o = evaluate(st, c, ENV, timeout=7)
    assert o.passed and o.observed == "baseline" and o.expected == "equals 'baseline'"
    assert st.calls == [("runner", ("cat", "--", "/work/out.txt"), st.calls[0][2])]
    assert st.calls[0][2]["timeout"] == 7


def test_sql_check_argv_takes_user_and_db_from_compose_env() -> None:
    st = stack_answering("baseline\n")
    c = Check("q", "sql", {"service": "app-db", "query": "select name from w", "equals": "baseline"})
    assert evaluate(st, c, ENV, timeout=5).passed
    argv = st.calls[0][1]
    assert argv == (
        "psql", "-At", "-v", "ON_ERROR_STOP=1", "-U", "app", "-d", "shop", "-c", "select name from w",
    )  # fmt: skip


def test_sql_check_options_override_and_default_to_postgres() -> None:
    st = stack_answering("1")
    bare = ResolvedConfig.of(
        make_task(compose={"services": {"db": {"environment": ["OTHER=1"]}}}).environment.compose
    )
    evaluate(st, Check("q", "sql", {"service": "db", "query": "select 1"}), bare, timeout=5)
    assert st.calls[-1][1][4:8] == ("-U", "postgres", "-d", "postgres")
    evaluate(
        st, Check("q", "sql", {"service": "db", "query": "q", "user": "u", "database": "d"}), bare, timeout=5
    )
    assert st.calls[-1][1][4:8] == ("-U", "u", "-d", "d")


def test_sql_check_uses_the_resolved_config_as_the_seed_does() -> None:
    # `POSTGRES_USER: ${PGUSER:-app}` in the compose file: the seed connects as the interpolated value,
    # and so must the check, or it reads another database than the one the seed wrote.
    resolved = {"services": {"db": {"environment": {"POSTGRES_USER": "app", "POSTGRES_DB": "shop"}}}}
    st = stack_answering("1")
    evaluate(
        st, Check("q", "sql", {"service": "db", "query": "select 1"}), ResolvedConfig.of(resolved), timeout=5
    )
    assert st.calls[-1][1][4:8] == ("-U", "app", "-d", "shop")
    assert postgres_credentials({}, resolved["services"]["db"]["environment"]) == ("app", "shop")


def test_sql_error_is_a_failed_check_with_psql_stderr() -> None:
    st = stack_answering(rc=1, stderr='ERROR:  relation "w" does not exist')
    o = evaluate(st, Check("q", "sql", {"service": "app-db", "query": "x", "equals": "1"}), ENV, timeout=5)
    assert not o.passed and o.observed is None
    assert o.error is not None and 'relation "w" does not exist' in o.error and "exited 1" in o.error


def test_redis_check_argv_and_error_reply() -> None:
    st = stack_answering("processing\n")
    c = Check("r", "redis", {"service": "cache", "command": ["GET", "order:1"], "contains": "proc"})
    assert evaluate(st, c, ENV, timeout=5).passed
    assert st.calls[0][1] == ("redis-cli", "--raw", "GET", "order:1")
    bad = evaluate(stack_answering("ERR unknown command 'GTE'\n"), c, ENV, timeout=5)
    assert not bad.passed and bad.error is not None and "ERR unknown command" in bad.error


def test_exec_timeout_and_docker_failure_are_failed_checks() -> None:
    c = Check("f", "file", {"service": "runner", "path": "/x", "equals": "y"})
    o = evaluate(stack_answering(raises=CommandTimeout(["docker"], 5)), c, ENV, timeout=5)
    assert not o.passed and o.error is not None and "timed out after 5s" in o.error
    o = evaluate(
        stack_answering(raises=CommandError(["docker"], 1, "", "no such service")), c, ENV, timeout=5
    )
    assert not o.passed and o.error is not None and "could not run" in o.error


def test_unknown_type_and_bad_regex_do_not_crash() -> None:
    assert not evaluate(stack_answering(), Check("x", "ldap", {"service": "s"}), ENV, timeout=1).passed
    c = Check("f", "file", {"service": "s", "path": "/x", "regex": "("})
    o = evaluate(stack_answering("x"), c, ENV, timeout=1)
    assert not o.passed and o.observed == "x"


def test_service_environment_forms() -> None:
    def service_environment(config: Mapping[str, Any], service: str) -> dict[str, str]:
        return dict(ResolvedConfig.of(config).service(service).environment)

    assert service_environment({"services": {"s": {"environment": ["A=1", "B=x=y"]}}}, "s") == {
        "A": "1",
        "B": "x=y",
    }
    assert service_environment({}, "s") == {}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/orders/1":
            body, status = json.dumps({"status": "shipped", "items": [{"n": 2}]}).encode(), 200
        else:
            body, status = b'{"error": "nope"}', 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_http_check_status_and_json_field(http_port: int) -> None:
    st = stack_answering()
    st.ports[("api", 8000)] = ("127.0.0.1", http_port)
    spec = {"service": "api", "port": 8000, "path": "/orders/1", "status": 200}
    c = Check("h", "http", {**spec, "json": {"field": "status", "equals": "shipped"}})
    o = evaluate(st, c, ENV, timeout=5)
    assert o.passed and o.observed == "shipped"
    nested = Check("h", "http", {**spec, "json": {"field": "items.0.n", "equals": 2}})
    assert evaluate(st, nested, ENV, timeout=5).passed
    missing = evaluate(
        st, Check("h", "http", {**spec, "json": {"field": "nope", "equals": 1}}), ENV, timeout=5
    )
    assert not missing.passed and missing.error is not None and "no field 'nope'" in missing.error
    wrong = evaluate(st, Check("h", "http", {**spec, "path": "/other"}), ENV, timeout=5)
    assert not wrong.passed and wrong.error is not None and "returned status 404, expected 200" in wrong.error
    expect_404 = Check("h", "http", {**spec, "path": "/other", "status": 404, "contains": "nope"})
    assert evaluate(st, expect_404, ENV, timeout=5).passed


def test_http_refused_is_a_failed_check(http_port: int) -> None:
    st = stack_answering()
    st.ports[("api", 8000)] = ("127.0.0.1", 1)
    o = evaluate(st, Check("h", "http", {"service": "api", "port": 8000, "status": 200}), ENV, timeout=2)
    assert not o.passed and o.error is not None and "failed" in o.error


# ----------------------------------------------------------------------------------------------- oracle


def test_oracle_command_is_execd_with_env_and_workdir(tmp_path: Path) -> None:
    st = stack_answering("done\n")
    env = {"K": "v", "API_TOKEN": "tok-123", "DB_PASSWORD": "pw-456"}
    o = Oracle(service="runner", command=("python3", "/pack/o.py"), env=env, workdir="/work")
    r = run_oracle(st, o, timeout=12, out_dir=tmp_path)
    assert r.ok and r.rc == 0
    service, argv, kw = st.calls[0]
    assert (service, argv) == ("runner", ("python3", "/pack/o.py"))
    # the secret-named values go with the call, to be redacted from its log line and any error
    assert kw == {
        "stdin": None,
        "timeout": 12,
        "env": env,
        "workdir": "/work",
        "secrets": ("pw-456", "tok-123"),
    }
    assert (tmp_path / "oracle.stdout").read_text() == "done\n"


def test_oracle_gets_forges_variables_but_its_own_env_wins() -> None:
    st = stack_answering()
    o = Oracle(service="runner", command=("true",), env={"K": "v", "FORGE_SEED_X": "mine"})
    run_oracle(st, o, timeout=5, extra_env={"FORGE_SEED_X": "/run/forge/seeds/x", "FORGE_SEED_Y": "/y"})
    assert st.calls[0][2]["env"] == {"K": "v", "FORGE_SEED_X": "mine", "FORGE_SEED_Y": "/y"}


def test_oracle_script_streams_on_stdin(tmp_path: Path) -> None:
    script = tmp_path / "solve.py"
    script.write_text("print(1)\n")
    st = stack_answering()
    r = run_oracle(st, Oracle(service="runner", script=script, interpreter=("python3", "-")), timeout=5)
    assert r.ok
    assert st.calls[0][1] == ("python3", "-") and st.calls[0][2]["stdin"] == script


def test_oracle_failure_and_timeout() -> None:
    o = Oracle(service="runner", command=("false",))
    r = run_oracle(stack_answering(rc=3, stderr="Traceback\nValueError: x"), o, timeout=5)
    assert not r.ok and not r.timed_out and r.rc == 3
    assert r.reason() == "Oracle failed: `false` in service 'runner' exited 3: Traceback\nValueError: x"
    t = run_oracle(stack_answering(raises=CommandTimeout(["docker"], 5, "partial")), o, timeout=5)
    assert t.timed_out and not t.ok and t.error == "`false` in service 'runner' timed out after 5s"


def test_oracle_timeout_is_capped_by_the_run_config() -> None:
    assert effective_timeout(Oracle(service="s", timeout=120), 300) == 120
    assert effective_timeout(Oracle(service="s", timeout=900), 300) == 300


def test_a_chatty_oracles_output_streams_to_its_files_through_compose_exec(tmp_path: Path) -> None:
    # ComposeProject.exec hands the runner a stdout_path and a stderr_path: the output never passes through
    # forge's memory; the result keeps only the stdout's tail (for a failure's reason) and the stderr's.
    chatty = "".join(f"line {i}\n" for i in range(50_000))  # ~540 KB
    fake = FakeRunner()
    fake.expect("docker", "compose", stdout=chatty, stderr="boom\n", rc=1)
    stack = ComposeProject("p", (), fake)
    r = run_oracle(stack, Oracle(service="runner", command=("chatter",)), timeout=5, out_dir=tmp_path)
    (call,) = fake.calls
    assert call.stdout_path == tmp_path / "oracle.stdout" and call.argv[-1] == "chatter"
    assert call.stderr_path == tmp_path / "oracle.stderr"
    assert (tmp_path / "oracle.stdout").read_text() == chatty
    assert len(r.stdout) == FILE_TAIL and chatty.endswith(r.stdout)
    assert (tmp_path / "oracle.stderr").read_text() == "boom\n" and not r.ok and "boom" in (r.error or "")


def test_an_oracle_without_a_trial_dir_keeps_its_output_in_the_result() -> None:
    r = run_oracle(stack_answering("done\n"), Oracle(service="runner", command=("true",)), timeout=5)
    assert r.ok and r.stdout == "done\n"


def test_read_once_reads_a_file_once_for_all_its_concurrent_readers_and_shares_a_failure() -> None:
    gate = threading.Event()

    def answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        gate.wait(5)  # every reader asks before the first answer arrives
        if argv[-1] == "/gone":
            raise CommandTimeout(["docker", "exec"], 9)
        return ok(f"{service}:{argv[-1]}")

    st = FakeStack(answer, ports={("api", 80): ("127.0.0.1", 4000)})
    view = ReadOnce(st)
    jobs = [("runner", "/n")] * 6 + [("runner", "/m"), ("other", "/n"), ("x", "/gone")] * 2
    got: dict[int, Any] = {}

    def read(i: int, svc: str, path: str) -> None:
        try:
            got[i] = view.exec(svc, read_argv(path), timeout=5, check=False).stdout
        except CommandTimeout as e:
            got[i] = e

    threads = [threading.Thread(target=read, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert [got[i] for i in range(6)] == ["runner:/n"] * 6
    assert got[6] == got[9] == "runner:/m" and got[7] == got[10] == "other:/n"
    assert isinstance(got[8], CommandTimeout) and got[8] is got[11]  # one failure, seen by both
    assert sorted((s, a[-1]) for s, a, _ in st.calls) == [
        ("other", "/n"), ("runner", "/m"), ("runner", "/n"), ("x", "/gone")
    ]  # fmt: skip
    # Anything but a plain read (another command, stdin, check=True) goes to the stack every time.
    view.exec("runner", ["psql", "-c", "select 1"], timeout=5, check=False)
    view.exec("runner", ["psql", "-c", "select 1"], timeout=5, check=False)
    view.exec("runner", read_argv("/n"), timeout=5, check=False, env={"A": "1"})
    assert len(st.calls) == 7
    assert view.port("api", 80) == ("127.0.0.1", 4000)
    st.ports[("api", 80)] = ("127.0.0.1", 5000)
    assert view.port("api", 80) == ("127.0.0.1", 4000)  # looked up once per grading pass


def test_a_stop_killing_an_oracle_or_check_exec_propagates_unwrapped() -> None:
    """Interrupted (the stop killed or refused the exec) is no oracle failure and no failed check: it
    propagates as it is, as provisioning lets it (before: "could not run: stop requested ...")."""
    from forgelib.errors import Interrupted

    stop = Interrupted("stop requested (SIGINT): `exec` was stopped")
    with pytest.raises(Interrupted):
        run_oracle(stack_answering(raises=stop), Oracle(service="runner", command=("true",)), timeout=5)
    for check in (
        Check("f", "file", {"service": "runner", "path": "/x", "equals": "y"}),
        Check("s", "sql", {"service": "app-db", "query": "select 1", "equals": "1"}),
        Check("r", "redis", {"service": "cache", "command": "GET k", "equals": "v"}),
    ):
        with pytest.raises(Interrupted):
            evaluate(stack_answering(raises=stop), check, ENV, timeout=5)

    class Refused(FakeStack):
        def port(self, service: str, container_port: int) -> tuple[str, int]:
            raise stop

    http = Check("h", "http", {"service": "api", "port": 80, "path": "/", "status": 200})
    with pytest.raises(Interrupted):
        evaluate(Refused(lambda s, a, k: ok()), http, ENV, timeout=5)
    with pytest.raises(Interrupted):  # through ReadOnce, as grading reads
        evaluate(ReadOnce(stack_answering(raises=stop)), check, ENV, timeout=5)
