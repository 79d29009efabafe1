"""Training: truncated BPTT, the optimiser, the training loop, hyper-parameter search, the
sessions it learns from and the calibration fit."""
