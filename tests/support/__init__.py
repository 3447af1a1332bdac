"""Helpers shared by the test modules (on sys.path through pytest's ``pythonpath = ["tests"]``)."""
