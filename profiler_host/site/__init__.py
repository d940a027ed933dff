"""Not a package: the directory itself goes on PYTHONPATH (see cli.py)."""
