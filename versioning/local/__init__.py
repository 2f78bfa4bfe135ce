"""The embedded ``local`` adapter of the DataRepo port (see :mod:`versioning.local.repo`)."""

from versioning.local.repo import LocalRepo

__all__ = ["LocalRepo"]
