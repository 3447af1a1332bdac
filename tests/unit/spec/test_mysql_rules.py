"""A mysql service's spec rules, refused by ``forge validate`` and at every load, before any stack starts
(the engine is never asked): a MySQL 8 dump bound to a MariaDB image, with the fix; a ``sql_dump`` on an
image forge cannot recognise, with the label that declares it; a label that names no kind, or another kind
than the image runs. Each names the file, the line and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from forgelib.errors import SpecError
from forgelib.spec.digest import seed_digest
from forgelib.spec.loader import load_project_config
from forgelib.spec.models import SeedKind
from forgelib.spec.validate import validate_project

MARIADB_SAFE = (
    "CREATE TABLE orders (id INT PRIMARY KEY) DEFAULT CHARSET=utf8mb4;\nINSERT INTO orders VALUES (1);\n"
)
MYSQL8 = (
    "-- MySQL dump 10.13  Distrib 8.0.36, for Linux (x86_64)\n"
    "CREATE TABLE orders (id int) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_0900_ai_ci;\n"
    "/*!80016 SET @@default_collation_for_utf8mb4 = utf8mb4_0900_ai_ci */;\n"
    "/*!50017 DEFINER=`root`@`localhost`*/ /*!50003 TRIGGER t BEFORE INSERT ON orders"
    " FOR EACH ROW SET @x=1 */;\n"
)


def _project(tmp_path: Path, image: str, dump: str = MARIADB_SAFE, labels: str = "") -> Path:
    """A one-service project: shop-db (``image``, written at line 3 of the compose file) reset from
    ``dump``."""
    root = tmp_path / "shop"
    (root / "assets").mkdir(parents=True)
    (root / "shared").mkdir()
    seed = root / "assets" / "orders.sql"
    seed.write_text(dump)
    (root / "shared" / "environment.compose.yaml").write_text(
        "services:\n"
        "  shop-db:\n"
        f"    image: {image}\n"
        "    environment: {MARIADB_ROOT_PASSWORD: root, MARIADB_DATABASE: shop}\n"
        + (f"    labels: {labels}\n" if labels else "")
    )
    (root / "project.yaml").write_text(
        "name: shop\n"
        "assets:\n"
        "  seeds:\n"
        "    orders:\n"
        "      path: assets/orders.sql\n"
        "      kind: sql_dump\n"
        f'      digest: "{seed_digest(seed, SeedKind.SQL_DUMP)}"\n'
        "default_environment:\n"
        "  compose_file: shared/environment.compose.yaml\n"
        "  services:\n"
        "    shop-db: {isolation: reset, reset: {seed: orders}}\n"
    )
    return root


def _errors(project: Path) -> list[str]:
    return [str(i) for i in validate_project(str(project)).errors]


@pytest.mark.parametrize("image", ["mariadb:10.11", "forgelib/mariadb:10.11", "mysql:8.0"])
def test_a_dump_the_server_reads_is_valid(tmp_path: Path, image: str) -> None:
    assert _errors(_project(tmp_path, image)) == []


def test_a_mysql8_dump_on_mariadb_is_refused_before_any_stack_with_the_fix(tmp_path: Path) -> None:
    project = _project(tmp_path, "mariadb:10.11", MYSQL8)
    (error,) = _errors(project)
    assert "environment.compose.yaml:3:12: $.services.shop-db.image:" in error, error
    assert "service 'shop-db' resets from seed 'orders': the dump was written by MySQL 8" in error, error
    assert "its header says MySQL 8; MySQL 8's collation utf8mb4_0900_* at line 2" in error, error
    assert "a /*!80xxx */ version comment at line 3; DEFINER= clauses (first at line 4)" in error, error
    assert "but the service runs MariaDB (image mariadb:10.11)" in error, error
    assert "bind the seed to a MySQL 8 service" in error and "sed -E" in error, error
    with pytest.raises(SpecError) as err:  # `forge run` loads the project before it starts anything
        load_project_config(project)
    assert "written by MySQL 8" in str(err.value), err.value


def test_a_mysql8_dump_on_mysql8_is_valid(tmp_path: Path) -> None:
    assert _errors(_project(tmp_path, "mysql:8.0", MYSQL8)) == []


def test_an_unrecognised_image_names_the_label_that_declares_it(tmp_path: Path) -> None:
    (error,) = _errors(_project(tmp_path, "example/shopdb:1"))
    assert "project.yaml:11:" in error and "$.default_environment.services.shop-db.reset.seed" in error, error
    assert "seed 'orders' is kind sql_dump, which postgres and mysql both apply" in error, error
    assert "forge cannot tell which server service 'shop-db' runs (image 'example/shopdb:1')" in error, error
    assert "with the label io.forgelib.kind: mysql (or postgres)" in error, error
    assert (
        _errors(_project(tmp_path / "labelled", "example/shopdb:1", labels="{io.forgelib.kind: mysql}")) == []
    )


def test_a_label_that_names_no_kind_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    errors = _errors(_project(tmp_path, "example/shopdb:1", labels="{io.forgelib.kind: mysq}"))
    (error,) = [e for e in errors if "io.forgelib.kind" in e and "not a kind" in e]
    assert "environment.compose.yaml:5:" in error, error  # the labels line
    assert "label io.forgelib.kind: 'mysq' is not a kind forge knows; did you mean 'mysql'?" in error, error


def test_a_postgres_image_declared_mysql_is_refused(tmp_path: Path) -> None:
    errors = _errors(_project(tmp_path, "postgres:16", labels="{io.forgelib.kind: mysql}"))
    declared = [e for e in errors if "is declared mysql" in e]
    assert len(declared) == 1, errors
    assert "environment.compose.yaml:5:" in declared[0], declared
    assert "its image 'postgres:16' runs postgres; remove the label" in declared[0], declared
