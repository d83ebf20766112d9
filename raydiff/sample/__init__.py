"""Sampling from a trained model: samples that depend only on (seed, index) (:mod:`.generate`)
and the files they are written to (:mod:`.outputs`). No Ray here."""
