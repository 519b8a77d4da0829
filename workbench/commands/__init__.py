"""Subcommands of the ``workbench`` CLI, one module each (``add_arguments`` + ``run``)."""
