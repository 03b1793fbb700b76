"""Operator reports over broker stores and the ingested Delta tables (consumer lag, DLQ, audit)."""
