"""What a forward pass costs, and what the drafter and loops do with it: the curve and prices
(curve.py) and the draft mode (mode.py), both model-free; measuring the curve (calibrate.py); the
calibration file (store.py); batched steps' costs by rows and positions (grid.py) and the
pricing of batched drafts (batch.py)."""
