"""The lakeFS adapter of the DataRepo port, over the official high-level ``lakefs`` SDK."""

from versioning.lakefs.config import LakeFSConfigError, LakeFSCredentials, lakectl_credentials
from versioning.lakefs.errors import RetryPolicy
from versioning.lakefs.repo import LakeFSRepo

__all__ = ["LakeFSConfigError", "LakeFSCredentials", "LakeFSRepo", "RetryPolicy", "lakectl_credentials"]
