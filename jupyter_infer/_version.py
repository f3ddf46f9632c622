"""The package's version, in a module of its own: the server extension reads it without
importing the top package (whose ``__init__`` imports the extension)."""

__version__ = "0.1.0"  # keep equal to pyproject.toml's [project] version
