"""Evaluation of trained models: the variational bound (bits/dim) and sample quality (FID/KID)."""
