"""Judging models on real shops (docs/models.md, Judged on held-out users): session features
a data scientist would build, the baselines fitted on them, and the protocol that compares
them with the recurrent model on users no choice saw."""
