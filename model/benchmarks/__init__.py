"""Benchmarks, run as `python -m model.benchmarks.NAME`: kernels, training, calibration,
long range, real shops."""
