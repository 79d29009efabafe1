"""intentstream's model: the Elman cell kernels, the artifact format and offline scoring.

Pure computation; this package never imports `worker`.
"""
