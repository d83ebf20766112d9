"""raydiff's Grafana dashboard, shipped in the package: ``raydiff_training.json``.

Its panels chart the ``ray_raydiff_*`` gauges (:mod:`raydiff.orchestrate.metrics`) of the runs
its ``run`` variable selects: throughput, losses, validation, optimiser state, workers, failures
and preemptions. It is a plain Grafana dashboard file, installed the way Ray's own are: copied
into a folder a Grafana dashboard provider loads, such as the one Ray provisions its dashboards
from (``RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR``, by default the session's
``metrics/grafana/dashboards``). docs/operations.md gives the steps;
``python -m raydiff.dashboards`` prints the file's path for them.

No Ray here: only the file and its path.
"""

from __future__ import annotations

from pathlib import Path

TRAINING_DASHBOARD = Path(__file__).with_name("raydiff_training.json")
"""The training dashboard (Grafana JSON, uid ``raydiffTraining``)."""
