"""The tree kind."""
