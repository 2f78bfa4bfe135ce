"""An HTTP double of the lakeFS API, backed by the local adapter, with seeded fault injection."""

from tests.lakefs_double.faults import FaultConfig
from tests.lakefs_double.server import LakeFSDouble

__all__ = ["FaultConfig", "LakeFSDouble"]
