"""Tests of the command line, one file per command module of `vitkit.cli`."""
