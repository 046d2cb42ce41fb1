"""Generates the chart's derived files (the Grafana dashboard JSON, the CRD copy) from their sources."""
