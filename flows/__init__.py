"""Prefect flows (the DAGs), their parameter models, and the ``tokenlake`` CLI."""
