"""Tensor, sequence, pipeline and data parallelism over simulated or gloo process groups."""
