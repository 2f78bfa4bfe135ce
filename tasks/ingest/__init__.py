"""The ingest stage: sources (directory trees, JSONL, Parquet) into normalised documents.

Pure parts: :func:`plan_partitions` and :func:`ingest_partition` (Arrow tables out);
:func:`run_ingest` writes (:func:`tasks.stage.run_stage` commits); :data:`ingest_task` is the Prefect task
(import it from ``tasks.ingest.task`` so the pure parts never import Prefect).
"""

from tasks.ingest.config import IngestConfig, IngestGateConfig, SourceConfig
from tasks.ingest.documents import ingest_partition, iter_partition
from tasks.ingest.partitions import Partition, check_source, plan_partitions
from tasks.ingest.stage import run_ingest

__all__ = [
    "IngestConfig",
    "IngestGateConfig",
    "Partition",
    "SourceConfig",
    "check_source",
    "ingest_partition",
    "iter_partition",
    "plan_partitions",
    "run_ingest",
]
