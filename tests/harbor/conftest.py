"""tests/harbor runs only where harbor is installed (Python >= 3.12: .ci/run's harbor venv); elsewhere
(the 3.11 suites) nothing here is collected."""

from __future__ import annotations

import importlib.util
import sys

collect_ignore_glob = [] if sys.version_info >= (3, 12) and importlib.util.find_spec("harbor") else ["*.py"]
