"""Run task.py with the scripted agent (no model, no network): ``python run_offline.py``."""

from __future__ import annotations

import sys
from pathlib import Path

from inspect_ai import eval
from inspect_ai.model import get_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scripted import MODEL, agent
from task import diagnose_stale_order

if __name__ == "__main__":
    logs = eval(diagnose_stale_order(), model=get_model(MODEL, custom_outputs=agent))
    sys.exit(0 if all(log.status == "success" for log in logs) else 1)
