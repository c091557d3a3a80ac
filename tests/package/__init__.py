"""Tests of the package as a whole: layering, public API, sizes and input files everywhere,
the user guide's snippets, the wheel."""
