"""intentstream's model: the cell kernels (Elman, GRU), the artifact format, scoring, training.

Pure computation; this package never imports `worker`.
"""
