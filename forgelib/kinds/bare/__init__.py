"""The bare kind."""
