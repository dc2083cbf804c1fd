"""Helpers shared by the unit tests (see docs/testing.md: test modules import only from here)."""
