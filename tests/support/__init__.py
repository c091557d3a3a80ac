"""Helpers shared by the tests: harnesses, reference implementations, subprocess drivers and
the repository's paths (``tests.support.paths``). Nothing here is collected as a test."""
