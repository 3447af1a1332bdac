"""A deterministic STAND-IN for a model-based judge (the pack ships no model and needs no network).

forge runs it on the host, in this directory, with the agent's note on stdin (``judge.input`` in
grading.yaml) and FORGE_TASK / FORGE_INSTRUCTION in its environment, and reads one JSON line from its
stdout: {"score": <0..1>, "reason": "..."}. A real judge keeps that contract and puts a model call (with
its own API key in the environment) where the rubric below is.

The rubric weighs the evidence most: a note that names the right cause but quotes nothing it read is a
weak diagnosis.
"""

from __future__ import annotations

import json
import re
import sys

note = sys.stdin.read()
rubric = [
    # (weight, what a good diagnosis has, found?)
    (
        0.40,
        "quotes the stale status and the true one",
        bool(re.search(r'"processing"', note)) and bool(re.search(r'"shipped"', note)),
    ),
    (0.30, "names the missing cache invalidation", "invalidat" in note.lower()),
    (
        0.15,
        "locates it in the status update path or the cached key",
        bool(re.search(r"POST /orders|order:<id>|order:4021", note)),
    ),
    (0.15, "proposes a fix", bool(re.search(r"\bfix\b|delete the key|invalidate .* after", note, re.I))),
]
score = round(sum(w for w, _, ok in rubric if ok), 6)
missing = [what for _, what, ok in rubric if not ok]
reason = "stand-in rubric: " + ("all of it" if not missing else "missing: " + "; ".join(missing))
print(json.dumps({"score": score, "reason": reason}))
