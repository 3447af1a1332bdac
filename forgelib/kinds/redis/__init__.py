"""The redis kind."""
