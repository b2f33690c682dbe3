"""Grafana: the dashboards built as code (``dashboards``) and their upload to a running
Grafana (``push``). Rule: it reads no records; it knows metric names, not runs."""
