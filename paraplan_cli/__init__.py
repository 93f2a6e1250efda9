"""The ``paraplan`` command line (typer). Subcommands import their backends lazily."""
