"""A model with a block of its own, calibrated with ``dssup calibrate --module`` (see model.py)."""
