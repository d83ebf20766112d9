"""Hyperparameter sweeps: the sweep file (:mod:`raydiff.sweep.spec`) and its results
(:mod:`raydiff.sweep.results`). No Ray here; :mod:`raydiff.orchestrate.sweep` runs them on Tune."""
