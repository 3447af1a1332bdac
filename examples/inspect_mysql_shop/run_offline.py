"""Run task.py with the scripted agent (no model, no network): ``python run_offline.py [--epochs N]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inspect_ai import eval
from inspect_ai.model import get_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scripted import MODEL, agent
from task import mysql_shop

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--stacks", choices=["fresh", "warm"], default="warm")
    a = p.parse_args()
    logs = eval(
        mysql_shop(stacks=a.stacks),
        model=get_model(MODEL, custom_outputs=agent),
        epochs=a.epochs,
        max_samples=1,
    )
    sys.exit(0 if all(log.status == "success" for log in logs) else 1)
