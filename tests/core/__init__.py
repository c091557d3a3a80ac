"""Tests of the bottom-layer modules outside storage and stats: layout.py, elastic.py and the
fault points of testing/."""
