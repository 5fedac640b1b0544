"""Tuning and diagnosis: the offline sweep (tune.py), the bottleneck report (diagnose.py) and
dataset statistics (stats.py); the decisions themselves are the C++ engine's."""
