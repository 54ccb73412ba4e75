"""Exceptions that end a command with a message for people rather than a traceback."""

from __future__ import annotations


class InputError(Exception):
    """The input cannot be read at all (exit code 2): not a checkpoint, corrupt file, unsafe path."""


class UsageError(Exception):
    """The command line asks for something impossible (exit code 4)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so that it unwinds (temporary files removed) like Ctrl-C does."""
