"""A small pure-Python library: the recording benchmark's suite (bench/record_py312.py)."""
