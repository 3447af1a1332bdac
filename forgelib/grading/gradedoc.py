"""grade.yaml: a ``Grade`` as the document a trial's directory holds, and back (``forge run`` writes it,
``forge grade`` reads it); and the atomic writer every document of a run goes through."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from forgelib.grading.score import CheckOutcome, Grade


def grade_doc(g: Grade) -> dict[str, Any]:
    doc = {
        "binary_pass": g.binary_pass,
        "score": g.score,
        "threshold": g.threshold,
        "components": dict(g.components),
        "checks": [check_doc(c) for c in g.checks],
        "reasons": list(g.reasons),
    }
    if g.details:  # weighted components: every route's score and the winner, each judge's reason
        doc["details"] = {k: dict(v) for k, v in g.details.items()}
    if g.undecided:  # checks left out of the score: neither passed nor failed, with why
        doc["undecided"] = list(g.undecided)
    return doc


def check_doc(c: CheckOutcome) -> dict[str, Any]:
    """A check in grade.yaml: every field of its outcome, ``result`` (passed | failed | undecided) and
    ``reason`` (why it did not pass; null when it did). An undecided check has ``passed: null``: it
    neither passed nor failed (``decided: false`` says the same, for readers of older files)."""
    doc = asdict(c)
    out: dict[str, Any] = {}
    for k, v in doc.items():
        out[k] = None if k == "passed" and not c.decided else v
        if k == "passed":
            out["result"], out["reason"] = c.result, c.why()
    return out


def check_of(doc: Mapping[str, Any]) -> CheckOutcome:
    """A check as ``check_doc`` wrote it (or as a forge before ``result`` did) back into its outcome."""
    known = {k: v for k, v in doc.items() if k in CheckOutcome.__dataclass_fields__}
    known["passed"] = bool(known.get("passed"))  # null: undecided, which scores as not passed
    return CheckOutcome(**known)


def write_yaml(path: Path, doc: Mapping[str, Any]) -> None:
    atomic_write(path, yaml.safe_dump(dict(doc), sort_keys=False, allow_unicode=True, width=1000))


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
