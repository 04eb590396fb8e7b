"""The ``kumo`` command line (typer + rich)."""

from kumo_sdk.cli.app import app, main

__all__ = ["app", "main"]
