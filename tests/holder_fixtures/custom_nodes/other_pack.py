"""Fixture: a single-file custom node that remembers the last model it saw."""

LAST = []
