"""Curate stages: pure functions over Arrow data, each with a thin Prefect task around it."""
