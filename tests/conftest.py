"""The suite's root: its directory is on sys.path (pytest's rootdir conftest), so any test
imports the shared helpers with `from _helpers import ...`."""
