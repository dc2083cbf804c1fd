"""Helpers shared by the integration tests (see docs/testing.md: test modules import only from here)."""
