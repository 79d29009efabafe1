"""Event data: the synthetic shops, the REES46 (OpenCDP) importer and PyTorch weights."""
