"""Oracle for read_widget: read widget 1 through widgets-api and submit its name.

Streamed by forge to ``python3 -`` in the ``runner`` service (stdlib only: the python image has no pip).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

API = os.environ.get("WIDGETS_API", "http://widgets-api:8000")
SUBMISSION = Path(os.environ.get("SUBMISSION", "/work/submission.txt"))

with urllib.request.urlopen(f"{API}/widgets/1", timeout=10) as resp:
    widget = json.load(resp)

name = widget["name"]
# No trailing newline: the state check compares the file's text exactly.
SUBMISSION.write_text(name, encoding="utf-8")
print(f"widget 1 reads {name!r}; wrote {SUBMISSION}", file=sys.stderr)
