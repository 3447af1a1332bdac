"""Seeing a run: ``forge report`` (one self-contained HTML page built from the run's event log)."""
