"""``python -m raydiff.dashboards``: the path of raydiff's Grafana dashboard file, for the copy
into a Grafana dashboards folder (docs/operations.md)."""

from raydiff.dashboards import TRAINING_DASHBOARD

print(TRAINING_DASHBOARD)
