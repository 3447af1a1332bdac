"""``forge init``: a new project from the template shipped in this package."""
