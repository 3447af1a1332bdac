"""The engine layer: every Docker and compose call forge makes, and what it reads back."""
