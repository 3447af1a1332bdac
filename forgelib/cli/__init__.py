"""The ``forge`` program and its commands: parsing, dispatch, exit codes, progress and output."""
