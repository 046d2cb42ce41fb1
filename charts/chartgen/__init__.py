"""Generates the derived files from their sources: the chart's Grafana dashboard JSON and CRD copy, and
each distribution's module of the CRD's defaults."""
