"""``forge validate`` refuses what the service's kind cannot do (``forgelib.kinds``): a check or a tool call
aimed at a service of a kind that does not observe it, a seed bound to a service of a kind that does not
take its seed kind. Each refusal names the file, the line and the field, and says the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

from forgelib.spec.validate import validate_project

FIXTURE = Path(__file__).parent.parent.parent / "fixtures" / "projects" / "basic"
GRADING = Path("tasks/read_widget/grading.yaml")


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "basic"
    shutil.copytree(FIXTURE, project, symlinks=True)
    return project


def _errors(project: Path) -> list[str]:
    return [str(i) for i in validate_project(str(project)).errors]


def test_the_fixture_is_valid(tmp_path: Path) -> None:
    assert _errors(_project(tmp_path)) == []


def test_an_sql_check_on_a_redis_service_is_refused_at_its_line(tmp_path: Path) -> None:
    project = _project(tmp_path)
    grading = project / GRADING
    text = grading.read_text()
    grading.write_text(text.replace("sql: {service: app-db,", "sql: {service: cache,"))
    line = 1 + text.splitlines().index(next(ln for ln in text.splitlines() if "sql: {service: app-db" in ln))
    errors = _errors(project)
    assert len(errors) == 1, errors
    assert f"grading.yaml:{line}:" in errors[0], errors
    assert "$.checks[1].sql.service" in errors[0], errors
    assert "sql check needs a postgres service, but service 'cache' runs redis" in errors[0], errors
    assert "for a redis service use redis or redis_command" in errors[0], errors


def test_a_redis_check_on_a_postgres_service_is_refused(tmp_path: Path) -> None:
    project = _project(tmp_path)
    grading = project / GRADING
    grading.write_text(
        grading.read_text().replace(
            'sql: {service: app-db, query: "select name from widgets where id=1", equals: baseline}',
            "redis: {service: app-db, command: [GET, k], equals: baseline}",
        )
    )
    errors = _errors(project)
    assert (
        len(errors) == 1
        and "redis check needs a redis service, but service 'app-db' runs postgres" in errors[0]
    )


def test_a_tool_call_in_a_trace_check_aimed_at_the_wrong_kind_is_refused(tmp_path: Path) -> None:
    project = _project(tmp_path)
    grading = project / GRADING
    grading.write_text(
        grading.read_text()
        + "  - name: asked\n"
        + "    trace: {called: {tool: sql_query, args: {service: '^cache$'}}}\n"
        + "  - name: asked_right\n"
        + "    trace: {called: {tool: sql_query, args: {service: app-db}}}\n"
    )
    errors = _errors(project)
    assert len(errors) == 1, errors
    assert "$.checks[2].trace.called.args.service" in errors[0], errors
    assert "sql_query call needs a postgres service, but service 'cache' runs redis" in errors[0], errors


def test_a_seed_whose_kind_does_not_fit_its_service_is_refused_at_the_binding(tmp_path: Path) -> None:
    project = _project(tmp_path)
    pfile = project / "project.yaml"
    text = pfile.read_text()
    pfile.write_text(text.replace("      kind: sql_dump\n", "      kind: redis_dump\n"))
    errors = _errors(project)
    ours = [e for e in errors if "reset.seed" in e]
    assert len(ours) == 1, errors
    line = 1 + text.splitlines().index(
        "      reset: { seed: postgres_baseline, user: postgres, database: app }"
    )
    assert f"project.yaml:{line}:" in ours[0], ours
    assert "seed 'postgres_baseline' is kind redis_dump, but service 'app-db' runs postgres" in ours[0], ours
    assert "takes seeds of kind sql_dump, filesystem_dir, bare" in ours[0], ours
    assert "bind it to a service that runs redis" in ours[0], ours


def test_a_tree_or_bare_seed_fits_a_server_too(tmp_path: Path) -> None:
    project = _project(tmp_path)
    pfile = project / "project.yaml"
    pfile.write_text(
        pfile.read_text().replace(
            "      reset: {seed: cache_poisoned}\n", "      reset: {seed: site_files}\n"
        )
    )
    assert _errors(project) == []
