"""The test suite: one package per layer of torchrec_mtrains, helpers in ``tests.support``.

A package (not loose modules on sys.path) so that test modules of different layers may share
a basename, and helpers are imported by their full name (``from tests.support import ...``).
"""
