"""Tests of examples/dlrm: training runs, Criteo formats, crashes, full disks, several nodes."""
