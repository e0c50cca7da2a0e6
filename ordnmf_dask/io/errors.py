"""Exceptions raised by the I/O layer."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: the message names the file and 1-based line number, or the id."""


class StoreError(InputError):
    """A store that is absent, incomplete, unreadable or written by a newer format."""
