"""The postgres kind."""
