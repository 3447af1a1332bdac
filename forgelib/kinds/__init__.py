"""What forge knows about each sort of service state: one subpackage per kind, listed once in ``KINDS``.

How a seed kind, a kind and a check type relate (the one place this is decided):

* A **kind** is a sort of service state forge can seed, reset, snapshot and observe: ``postgres``,
  ``mysql`` and ``redis`` are *server* kinds, recognised from the compose service (its image, else its
  environment or command: ``Kind.images``/``Kind.detect``; or declared by the service's compose label
  ``io.forgelib.kind``, ``registry.DECLARED``, for an image forge cannot recognise); ``tree`` (a
  workspace directory) and ``bare`` (a read-only file) fit any service and are never recognised.
* A kind **accepts seed kinds**, the names the spec writes in ``seeds: {kind: ...}`` (``Kind.seeds``:
  postgres takes ``sql_dump``, redis ``redis_dump``, tree ``filesystem_dir``, bare ``bare``). A seed bound
  to a service is applied by the kind that accepts its seed kind *and* fits that service: a server kind
  only fits a service recognised as it, or one recognised as no kind at all (forge cannot prove
  otherwise); ``forge validate`` refuses a seed whose kind does not fit its service.
* A kind **observes check types** (``Kind.checks``: postgres ``sql``, redis ``redis``) and **backs MCP
  tools** (``Kind.tools``: ``sql_query``, ``redis_command``). A check or tool call aimed at a service is
  answered by the kind recognised for that service; a service recognised as another kind is refused by
  ``forge validate``; an unrecognised one is served by the first kind that observes the type.

So several kinds may accept one seed kind, observe one check type or back one tool (postgres and mysql
both take ``sql_dump``, ``sql`` and ``sql_query``): the service decides which, and ``forge validate``
refuses a seed that more than one server kind accepts bound to a service it cannot recognise. A new
kind is a package here
(``__init__`` declares its ``Kind``; ``seed``, ``check``, ``tool``, ``client``, ``rules``, ``hostcheck``
implement it) plus one line in ``KINDS``. The seed kinds, reset strategies, check types (with their fields,
``Kind.check_fields``) and tools the spec schemas list are generated from ``KINDS``
(``forgelib.docsgen``, whose ``--check`` lint runs).

Import layers: ``kind``, ``toolschema`` and each package's ``__init__`` are pure declarations (the spec
models read them); ``registry`` loads the implementations, which may use the spec models, compose and
the runner, but nothing above them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forgelib.kinds import bare, mysql, postgres, redis, tree
from forgelib.kinds.kind import Kind

# The kinds, in the order the spec lists their names: the one list.
KINDS: tuple[Kind, ...] = (postgres.KIND, tree.KIND, redis.KIND, bare.KIND, mysql.KIND)

# The names the spec uses, derived (schemas' enums are generated from these: ``forgelib.docsgen``).
SEED_KINDS: tuple[str, ...] = tuple(dict.fromkeys(s for k in KINDS for s in k.seeds))
DIRECTORY_SEEDS: frozenset[str] = frozenset(s for k in KINDS for s in k.directory_seeds)
SHORTHAND: dict[str, str] = {suffix: s for k in KINDS for suffix, s in k.shorthand.items()}
RESET_STRATEGIES: tuple[str, ...] = tuple(dict.fromkeys(["exact", *(s for k in KINDS for s in k.strategies)]))
CHECK_TYPES: tuple[str, ...] = tuple(dict.fromkeys(c for k in KINDS for c in k.checks))
# check type -> its fields' JSON Schema, from the first kind that declares them (written into
# schemas/grading.schema.json by ``forgelib.docsgen``)
CHECK_FIELDS: dict[str, Mapping[str, Any]] = {}
for _kind in KINDS:
    for _type, _fields in _kind.check_fields.items():
        CHECK_FIELDS.setdefault(_type, _fields)

__all__ = [
    "CHECK_FIELDS",
    "CHECK_TYPES",
    "DIRECTORY_SEEDS",
    "KINDS",
    "RESET_STRATEGIES",
    "SEED_KINDS",
    "SHORTHAND",
    "Kind",
]
