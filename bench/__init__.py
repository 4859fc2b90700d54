"""FastCI's benchmarks, run by ``make bench`` (``python -m bench``)."""
