"""``raydiff ema``: EMA weights of any length reconstructed from a run's post-hoc EMA snapshots
(:mod:`raydiff.ema.reconstruction`: its options and the reconstruction). No Ray here;
:mod:`raydiff.orchestrate.ema_sweep` runs its ``--evaluate`` sweep on Ray."""
