"""The dump-format preflight: what made a dump, read from the file itself, and whether the server it is
bound to can read it; refused before anything is applied, with the fix.

The common case: a dump written by MySQL 8 (``mysqldump`` 8.x, or a server 8.x) bound to MariaDB.
MariaDB does not know MySQL 8's default collation ``utf8mb4_0900_ai_ci`` (``Unknown collation``, at the
first table), and the dump's ``/*!80016 ... */`` version comments and ``DEFINER=`` clauses name features
and accounts of the MySQL server it came from. Pure: the scan streams the file line by line, so its size
never matters; the server's version comes from the apply (``select version()``) or, before any stack
starts, from the service's image (``forgelib.kinds.mysql.rules``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

_MYSQL8_COLLATION = re.compile(rb"utf8mb4_(?:0900|ja_0900|zh_0900)\w*")
_MYSQL8_COMMENT = re.compile(rb"/\*!8\d{4}\b")
_DEFINER = re.compile(rb"\bDEFINER\s*=", re.IGNORECASE)
_HEADER = re.compile(rb"^-- (?:MySQL dump [\d.]+\s+Distrib (\d+)\.|Server version\s+(\d+)\.)")
_MARIADB_HEADER = re.compile(rb"^-- (?:MariaDB dump|Server version\s+[\d.]+-MariaDB)")
HEADER_LINES = 40  # mysqldump's header comments come first


class Flavour(Enum):
    MYSQL = "MySQL"
    MARIADB = "MariaDB"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class DumpFacts:
    """Where a dump shows MySQL 8 (first line of each sign, 1-based; 0: none), and who wrote it."""

    mysql_major: int = 0  # from the header: mysqldump's or the source server's major (0: not said)
    mariadb: bool = False  # the header says MariaDB wrote it
    collation_line: int = 0
    comment_line: int = 0
    definer_line: int = 0

    @property
    def mysql8(self) -> bool:
        return self.mysql_major >= 8 or bool(self.collation_line or self.comment_line)


def scan(path: Path) -> DumpFacts:
    """Read the dump once, a line at a time."""
    major, mariadb = 0, False
    collation = comment = definer = 0
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if n <= HEADER_LINES:
                m = _HEADER.match(line)
                if m and not _MARIADB_HEADER.match(line):
                    major = max(major, int(m[1] or m[2]))
                mariadb = mariadb or bool(_MARIADB_HEADER.match(line))
            if not collation and _MYSQL8_COLLATION.search(line):
                collation = n
            if not comment and _MYSQL8_COMMENT.search(line):
                comment = n
            if not definer and _DEFINER.search(line):
                definer = n
    return DumpFacts(0 if mariadb else major, mariadb, collation, comment, definer)


def flavour_of(version: str) -> Flavour:
    """From ``select version()`` (``10.11.19-MariaDB-0+deb12u1``, ``8.0.36``) or an image name."""
    text = version.lower()
    if "mariadb" in text:
        return Flavour.MARIADB
    if re.match(r"\d", text) or "mysql" in text or "percona" in text:
        return Flavour.MYSQL
    return Flavour.UNKNOWN


def refusal(facts: DumpFacts, flavour: Flavour, server: str) -> str | None:
    """Why the server cannot read this dump, with the fix; None when it can (or cannot be told)."""
    if flavour is not Flavour.MARIADB or not facts.mysql8:
        return None
    signs = []
    if facts.mysql_major:
        signs.append(f"its header says MySQL {facts.mysql_major}")
    if facts.collation_line:
        signs.append(f"MySQL 8's collation utf8mb4_0900_* at line {facts.collation_line}")
    if facts.comment_line:
        signs.append(f"a /*!80xxx */ version comment at line {facts.comment_line}")
    if facts.definer_line:
        signs.append(f"DEFINER= clauses (first at line {facts.definer_line})")
    return (
        f"the dump was written by MySQL 8 ({'; '.join(signs)}), but the service runs MariaDB "
        f"({server}), which does not know MySQL 8's collations and features; bind the seed to a MySQL 8 "
        "service (image mysql:8), or convert the dump for MariaDB: "
        "sed -E -e 's/utf8mb4_0900_[a-z_]+/utf8mb4_unicode_ci/g' -e 's#/\\*!80[0-9]{3} [^*]*\\*/##g' "
        "-e 's/DEFINER=`[^`]*`@`[^`]*`//g' dump.sql > dump.mariadb.sql, then forge stamp"
    )
