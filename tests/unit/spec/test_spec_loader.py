"""Loading the fixture project into models, and a corpus of invalid specs each located precisely."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from forgelib.errors import SpecError, SpecIssue
from forgelib.spec.loader import load_grading, load_project_config, load_run_config
from forgelib.spec.models import Isolation, SeedKind
from forgelib.spec.validate import validate_project

from ._support import FIXTURES, edit


def test_valid_project_loads_with_absolute_paths_and_every_service() -> None:
    root = FIXTURES / "basic"
    project = load_project_config(root)
    assert project.name == "basic"
    assert project.root == root and project.path == root / "project.yaml"
    assert {n: (s.kind, s.path) for n, s in project.seeds.items()} == {
        "postgres_baseline": (SeedKind.SQL_DUMP, root / "assets/postgres_baseline.sql"),
        "cache_poisoned": (SeedKind.REDIS_DUMP, root / "assets/cache_poisoned.rdb"),
        "site_files": (SeedKind.FILESYSTEM_DIR, root / "assets/files"),
        "notes": (SeedKind.BARE, root / "assets/notes.bin"),
    }
    env = project.environment
    assert env.compose_file == root / "shared/environment.compose.yaml"
    assert set(env.services) == {"app-db", "cache", "runner", "files"}
    assert env.compose["services"]["cache"]["command"] == ["redis-server", "--save", ""]
    app_db = env.services["app-db"]
    assert app_db.isolation is Isolation.RESET
    assert app_db.reset is not None and app_db.reset.seed == "postgres_baseline"
    assert dict(app_db.reset.options) == {"user": "postgres", "database": "app"}
    assert env.services["runner"].isolation is Isolation.EPHEMERAL
    assert env.requires_per_trial
    assert [s.name for s in env.reset_services()] == ["app-db", "cache", "files"]
    assert project.run_configs == (root / "run_configs/dev.yaml",)


def test_tasks_get_the_effective_environment() -> None:
    project = load_project_config(FIXTURES / "basic")
    assert [t.name for t in project.tasks] == ["read_widget", "warm_cache"]
    read, warm = project.tasks
    # No manifest: the project's environment as is.
    assert read.environment == project.environment
    assert read.oracle is not None and read.oracle.script == read.path.parent / "solution/solve.sh"
    assert read.oracle.command is None and dict(read.oracle.env) == {"WIDGET": "1"}
    assert read.grading is not None and [c.name for c in read.grading.checks] == ["out_file", "db"]
    assert read.grading.checks[1].gate and read.grading.checks[1].weight == 2.0
    assert "widget 1" in read.instruction
    # The manifest deep-merges: cache becomes ephemeral (dropping its inherited reset), the rest stays.
    assert warm.environment.services["cache"].isolation is Isolation.EPHEMERAL
    assert warm.environment.services["cache"].reset is None
    assert warm.environment.services["app-db"] == project.environment.services["app-db"]
    assert warm.oracle is not None and warm.oracle.command == ("python3", "-c", "print('ok')")
    assert warm.grading is not None and warm.grading.path.name == "checks.yaml"
    http = warm.grading.checks[1]
    assert http.type == "http" and http.spec["json"]["equals"] == "shipped"
    with pytest.raises(TypeError):
        http.spec["json"]["equals"] = "x"


def test_task_compose_file_replaces_the_stack(basic: Path) -> None:
    (basic / "tasks/warm_cache/solo.compose.yaml").write_text("services:\n  runner:\n    image: x\n")
    edit(
        basic / "tasks/warm_cache/task.yaml",
        "  services:\n    cache: {isolation: ephemeral}\n",
        "  compose_file: ./solo.compose.yaml\n  services:\n    runner: {isolation: shared}\n",
    )
    (basic / "tasks/warm_cache/checks.yaml").write_text(
        "checks:\n  - name: f\n    file: {service: runner, path: /x, equals: y}\n"
    )
    warm = load_project_config(basic).task("warm_cache")
    assert warm.environment.compose_file == basic / "tasks/warm_cache/solo.compose.yaml"
    assert set(warm.environment.services) == {"runner"}
    assert warm.environment.services["runner"].isolation is Isolation.SHARED
    assert not warm.environment.requires_per_trial


def test_run_config_loads_with_paths_relative_to_it() -> None:
    project = load_project_config(FIXTURES / "basic")
    config = load_run_config(project.run_configs[0], project)
    assert config.project == project.root
    assert config.tasks == ("read_widget",) and config.repeats == 2 and config.workers == 1
    assert config.output == project.root / "runs"
    assert (
        config.timeouts.compose_up == 300 and config.timeouts.grading == 60 and config.timeouts.oracle == 300
    )


def test_load_grading_alone() -> None:
    grading = load_grading(FIXTURES / "basic/tasks/read_widget/grading.yaml")
    assert grading.threshold == 1.0 and len(grading.checks) == 2


def test_stale_digest_names_seed_path_both_digests_and_the_fix(basic: Path) -> None:
    (basic / "assets/postgres_baseline.sql").write_text("changed\n")
    with pytest.raises(SpecError) as info:
        load_project_config(basic)
    (issue,) = info.value.issues
    assert issue.json_path == "$.assets.seeds.postgres_baseline.digest" and issue.line == 9
    assert "'postgres_baseline'" in issue.message and "./assets/postgres_baseline.sql" in issue.message
    assert "declared sha256:ceb1521b" in issue.message and "actual sha256:" in issue.message
    assert "forge stamp" in issue.message


def test_loading_without_digest_verification(basic: Path) -> None:
    (basic / "assets/postgres_baseline.sql").write_text("changed\n")
    project = load_project_config(basic, verify_digests=False)
    assert project.seeds["postgres_baseline"].digest.startswith("sha256:ceb1521b")


def test_project_yaml_path_is_accepted_and_a_missing_one_reported(tmp_path: Path) -> None:
    assert load_project_config(FIXTURES / "basic/project.yaml").name == "basic"
    with pytest.raises(SpecError, match=r"no project\.yaml"):
        load_project_config(tmp_path)


def _symlink_out(root: Path) -> None:
    outside = root.parent / "outside.sql"
    outside.write_text("x")
    (root / "assets/link.sql").symlink_to(outside)


# (file edited, old, new, file of the issue, line, JSON path, message fragment[, setup])
Case = (
    tuple[str, str, str, str, int, str, str]
    | tuple[str, str, str, str, int, str, str, Callable[[Path], None]]
)
P, C = "project.yaml", "shared/environment.compose.yaml"
RT, RG = "tasks/read_widget/task.yaml", "tasks/read_widget/grading.yaml"
WT, WG = "tasks/warm_cache/task.yaml", "tasks/warm_cache/checks.yaml"
RC = "run_configs/dev.yaml"
DIGEST_14 = "      digest: sha256:cc39e7508aab7c42ab35aa02a29f637a8bcfe354f0426825061605c922e1925b\n"
CASES: dict[str, Case] = {
    "malformed_yaml": (P, "name: basic", "name: [basic", P, 3, "$", "invalid YAML"),
    "duplicate_key": (P, "name: basic\n", "name: basic\nname: other\n", P, 3, "$.name", "duplicate key"),
    "wrong_type": (P, "name: basic", "name: [a, b]", P, 2, "$.name", "expected a string, got a list"),
    "unknown_top_key": (P, "description:", "descripton:", P, 3, "$.descripton", "did you mean 'description'"),
    "missing_required": (
        P,
        "  compose_file: ./shared/environment.compose.yaml\n",
        "",
        P,
        20,
        "$.default_environment",
        "missing required key 'compose_file'",
    ),
    "bad_seed_name": (
        P,
        "    notes:",
        "    'no tes':",
        P,
        15,
        '$.assets.seeds["no tes"]',
        "not a valid name",
    ),
    "seed_kind_typo": (
        P,
        "kind: sql_dump",
        "kind: sql_dum",
        P,
        8,
        "$.assets.seeds.postgres_baseline.kind",
        "did you mean 'sql_dump'",
    ),
    "digest_mismatch": (
        P,
        "ceb1521b",
        "deb1521b",
        P,
        9,
        "$.assets.seeds.postgres_baseline.digest",
        "run `forge stamp",
    ),
    "digest_missing": (P, DIGEST_14, "", P, 12, "$.assets.seeds.site_files.digest", "has no digest"),
    "shorthand_without_digest": (
        P,
        "    postgres_baseline:            # full form\n      path: ./assets/postgres_baseline.sql\n"
        "      kind: sql_dump\n"
        '      digest: "sha256:ceb1521b0341832a20db7ea5234bbdc000c1720d6fb11ce452420a994e946e46"\n',
        "    postgres_baseline: ./assets/postgres_baseline.sql\n",
        P,
        6,
        "$.assets.seeds.postgres_baseline",
        "seed 'postgres_baseline' is written in the shorthand form (a bare path), which carries no digest; "
        "run `forge stamp --project",
    ),
    "digest_malformed": (
        P,
        "sha256:cc39e7508aab",
        "md5:cc39e7508aab",
        P,
        14,
        "$.assets.seeds.site_files.digest",
        "is not a sha256:<64 hex digits>",
    ),
    "seed_path_missing": (
        P,
        "./assets/notes.bin",
        "./assets/nope.bin",
        P,
        16,
        "$.assets.seeds.notes.path",
        "does not exist",
    ),
    "seed_path_escapes": (
        P,
        "./assets/notes.bin",
        "../outside.bin",
        P,
        16,
        "$.assets.seeds.notes.path",
        "outside the project",
    ),
    "seed_path_absolute_outside": (
        P,
        "./assets/notes.bin",
        "/etc/hostname",
        P,
        16,
        "$.assets.seeds.notes.path",
        "outside the project",
    ),
    "seed_symlink_escapes": (
        P,
        "./assets/notes.bin",
        "./assets/link.sql",
        P,
        16,
        "$.assets.seeds.notes.path",
        "through a symlink",
        _symlink_out,
    ),
    "dir_seed_is_a_file": (
        P,
        "path: assets/files",
        "path: assets/notes.bin",
        P,
        12,
        "$.assets.seeds.site_files.path",
        "not a directory",
    ),
    "file_seed_is_a_dir": (
        P,
        "path: ./assets/postgres_baseline.sql",
        "path: ./assets/files",
        P,
        7,
        "$.assets.seeds.postgres_baseline.path",
        "not a regular file",
    ),
    "illegal_shorthand": (
        P,
        "  seeds:\n",
        "  seeds:\n    extra: ./assets/notes.bin\n",
        P,
        6,
        "$.assets.seeds.extra",
        "only for .sql and .rdb",
    ),
    "reset_without_seed": (
        P,
        "      reset: {seed: cache_poisoned}\n",
        "",
        P,
        26,
        "$.default_environment.services.cache.isolation",
        "add reset: {seed: NAME}",
    ),
    "reset_block_on_ephemeral": (
        P,
        "runner: {isolation: ephemeral}",
        "runner: {isolation: ephemeral, reset: {seed: notes}}",
        P,
        33,
        "$.default_environment.services.runner.reset",
        "only isolation: reset services take a reset block",
    ),
    "reset_unknown_seed": (
        P,
        "{seed: cache_poisoned}",
        "{seed: cache_poisond}",
        P,
        27,
        "$.default_environment.services.cache.reset.seed",
        "did you mean 'cache_poisoned'",
    ),
    "reset_option_for_other_kind": (
        P,
        "{seed: cache_poisoned}",
        "{seed: cache_poisoned, user: x}",
        P,
        27,
        "$.default_environment.services.cache.reset.user",
        "does not apply",
    ),
    "reset_seed_key_typo": (
        P,
        "        seed: site_files",
        "        sed: site_files",
        P,
        31,
        "$.default_environment.services.files.reset.sed",
        "did you mean 'seed'",
    ),
    "isolation_missing": (
        P,
        "runner: {isolation: ephemeral}",
        "runner: {}",
        P,
        33,
        "$.default_environment.services.runner",
        "no isolation",
    ),
    "service_not_in_compose": (
        P,
        "    runner: {isolation: ephemeral}",
        "    runer: {isolation: ephemeral}",
        P,
        33,
        "$.default_environment.services.runer",
        "did you mean 'runner'",
    ),
    "compose_missing": (
        P,
        "./shared/environment.compose.yaml",
        "./shared/nope.yaml",
        P,
        20,
        "$.default_environment.compose_file",
        "not found",
    ),
    "compose_malformed": (C, "  cache:\n", "  cache\n", C, 7, "$", "invalid YAML"),
    "compose_redis_appendonly": (
        C,
        '["redis-server", "--save", ""]',
        '["redis-server", "--appendonly", "yes"]',
        C,
        8,
        "$.services.cache.command",
        "appendonly",
    ),
    "tasks_glob_matches_nothing": (
        P,
        '"tasks/**/task.yaml"',
        '"taks/**/task.yaml"',
        P,
        35,
        "$.tasks.glob",
        "matches no files",
    ),
    "task_unknown_key": (RT, "timeout: 60", "timout: 60", RT, 7, "$.oracle.timout", "did you mean 'timeout'"),
    "oracle_command_and_script": (
        RT,
        "  service: runner\n",
        "  service: runner\n  command: [x]\n",
        RT,
        5,
        "$.oracle",
        "exactly one of command",
    ),
    "oracle_unknown_service": (
        WT,
        "  service: runner",
        "  service: runnr",
        WT,
        7,
        "$.oracle.service",
        "did you mean 'runner'",
    ),
    "setup_unknown_service": (
        RT,
        "oracle:\n",
        "setup:\n  service: runnr\n  command: [sh, -c, 'true']\noracle:\n",
        RT,
        5,
        "$.setup.service",
        "did you mean 'runner'",
    ),
    "setup_command_and_script": (
        RT,
        "oracle:\n",
        "setup:\n  service: runner\n  command: [x]\n  script: ./solution/solve.sh\noracle:\n",
        RT,
        5,
        "$.setup",
        "a setup step needs exactly one of command",
    ),
    "checkpoint_capture_of_an_ephemeral_service": (
        P,
        "    runner: {isolation: ephemeral}",
        "    runner: {isolation: ephemeral, checkpoint: capture}",
        P,
        33,
        "$.default_environment.services.runner.checkpoint",
        "forge captures only reset services, by their kind",
    ),
    "checkpoint_capture_of_a_bare_seed": (
        P,
        "    runner: {isolation: ephemeral}",
        "    runner: {isolation: reset, reset: {seed: notes}, checkpoint: capture}",
        P,
        33,
        "$.default_environment.services.runner.checkpoint",
        "seed 'notes' is kind bare, which keeps no state in the service to capture",
    ),
    "checkpoint_choice_typo": (
        P,
        "    runner: {isolation: ephemeral}",
        "    runner: {isolation: ephemeral, checkpoint: fresch}",
        P,
        33,
        "$.default_environment.services.runner.checkpoint",
        "'fresh'",
    ),
    "oracle_script_missing": (
        RT,
        "./solution/solve.sh",
        "./solution/nope.sh",
        RT,
        6,
        "$.oracle.script",
        "is not a file",
    ),
    "task_manifest_unknown_service": (
        WT,
        "    cache: {isolation: ephemeral}",
        "    cache2: {isolation: ephemeral}",
        WT,
        5,
        "$.environment_manifest.services.cache2",
        "is not in",
    ),
    "task_manifest_unknown_seed": (
        WT,
        "cache: {isolation: ephemeral}",
        "cache: {reset: {seed: nope}}",
        WT,
        5,
        "$.environment_manifest.services.cache.reset.seed",
        "is not a seed in assets.seeds",
    ),
    "duplicate_task_name": (WT, "name: warm_cache", "name: read_widget", WT, 1, "$.name", "also used by"),
    "grading_file_missing": (
        WT,
        "grading: ./checks.yaml",
        "grading: ./nope.yaml",
        WT,
        9,
        "$.grading",
        "not found",
    ),
    "grading_two_types": (
        RG,
        '    file: {service: runner, path: /work/out.txt, equals: "baseline"}\n',
        '    file: {service: runner, path: /work/out.txt, equals: "baseline"}\n'
        "    redis: {service: cache, command: [GET, k], equals: v}\n",
        RG,
        3,
        "$.checks[0]",
        "exactly one of file, sql, redis, http",
    ),
    "grading_two_matchers": (
        RG,
        'equals: "baseline"}',
        'equals: "baseline", contains: x}',
        RG,
        4,
        "$.checks[0].file",
        "exactly one matcher",
    ),
    "grading_bad_regex": (
        RG,
        "equals: baseline}",
        'regex: "("}',
        RG,
        8,
        "$.checks[1].sql.regex",
        "invalid regular expression",
    ),
    "grading_duplicate_name": (
        RG,
        "name: db",
        "name: out_file",
        RG,
        5,
        "$.checks[1].name",
        "duplicate check name",
    ),
    "grading_unknown_service": (
        WG,
        "redis: {service: cache",
        "redis: {service: cach",
        WG,
        3,
        "$.checks[0].redis.service",
        "did you mean 'cache'",
    ),
    "grading_port_type": (
        WG,
        "port: 8000",
        "port: '8000'",
        WG,
        5,
        "$.checks[1].http.port",
        "expected an integer",
    ),
    "run_config_repeats": (RC, "repeats: 2", "repeats: 0", RC, 3, "$.repeats", "minimum"),
    "run_config_unknown_task": (
        RC,
        "tasks: [read_widget]",
        "tasks: [read_widgt]",
        RC,
        2,
        "$.tasks[0]",
        "did you mean 'read_widget'",
    ),
    "run_config_bad_project": (
        RC,
        "project: ..",
        "project: ../nope",
        RC,
        1,
        "$.project",
        "not a project directory",
    ),
    "run_config_timeout_typo": (
        RC,
        "compose_up: 300",
        "compose_upp: 300",
        RC,
        6,
        "$.timeouts.compose_upp",
        "did you mean 'compose_up'",
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_invalid_spec_is_located(basic: Path, case: Case) -> None:
    edited, old, new, file, line, json_path, fragment = case[:7]
    if len(case) == 8:
        case[7](basic)
    edit(basic / edited, old, new)
    report = validate_project(str(basic))
    assert not report.ok
    want = (str(basic / file), line, json_path)
    found = [i for i in report.errors if (_abs(i), i.line, i.json_path) == want]
    assert found, f"no issue at {want}; got:\n" + "\n".join(map(str, report.errors))
    assert any(fragment in i.message for i in found), "\n".join(map(str, found))


def _abs(issue: SpecIssue) -> str:
    return os.path.abspath(issue.file)


def test_every_problem_is_reported_at_once(basic: Path) -> None:
    edit(basic / P, "description:", "descripton:")
    edit(basic / RT, "timeout: 60", "timout: 60")
    edit(basic / RC, "repeats: 2", "repeats: 0")
    report = validate_project(str(basic))
    assert {i.json_path for i in report.errors} >= {"$.descripton", "$.oracle.timout", "$.repeats"}


def test_issue_renders_file_line_col_path_message(basic: Path) -> None:
    edit(basic / P, "kind: sql_dump", "kind: sql_dum")
    with pytest.raises(SpecError) as info:
        load_project_config(basic)
    rendered = str(info.value.issues[0])
    assert rendered.endswith(
        "project.yaml:8:13: $.assets.seeds.postgres_baseline.kind: 'sql_dum' is not one of: "
        "sql_dump, filesystem_dir, redis_dump, bare; did you mean 'sql_dump'?"
    )


def test_dir_seed_with_a_symlink_leading_out_is_refused(basic: Path) -> None:
    (basic.parent / "secret").write_text("s3cret\n")
    (basic / "assets/files/escape").symlink_to("../../../secret")
    (basic / "assets/files/fine").symlink_to("hello.txt")
    report = validate_project(str(basic))
    (issue,) = [i for i in report.errors if i.json_path == "$.assets.seeds.site_files.path"]
    assert issue.line == 12 and "escape -> ../../../secret" in issue.message and "fine" not in issue.message


def test_huge_values_are_not_echoed_back(basic: Path) -> None:
    edit(basic / "project.yaml", "name: basic", "name: " + "x" * 100_000)
    (issue,) = validate_project(str(basic)).errors
    assert issue.json_path == "$.name" and "too long (100000 characters; at most 100)" in issue.message
    assert len(str(issue)) < 300


def test_non_finite_numbers_are_refused(basic: Path) -> None:
    edit(basic / "run_configs/dev.yaml", "grading: 60", "grading: .nan")
    (issue,) = validate_project(str(basic)).errors
    assert (issue.line, issue.json_path) == (6, "$.timeouts.grading") and "finite" in issue.message


def test_every_spec_file_reports_yaml_and_schema_problems_in_one_pass(tmp_path: Path) -> None:
    # A duplicate key (YAML) and an unknown key (schema) in a grading file: both, as for project.yaml.
    from forgelib.spec.loader import collect_grading

    g = tmp_path / "grading.yaml"
    g.write_text("threshold: 1.0\nthreshold: 0.5\nchecks: []\nbogus: 1\n")
    _, issues = collect_grading(g)
    messages = " | ".join(f"{i.json_path}: {i.message}" for i in issues)
    assert "duplicate key" in messages and "$.bogus" in messages, messages
