"""Per-worker training logic (no Ray): the training step, precision, EMA, checkpoints."""
