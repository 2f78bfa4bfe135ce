"""The validate stage: quality filters (``tasks.quality``), language id, the quality
classifier and the Great Expectations gates.

Pure parts: :func:`apply_filters` (Arrow in, kept/quarantined/stats out), gated by the
runner of :mod:`tasks.gates`; :func:`run_validate` reads, writes and commits; the Prefect task is
``tasks.validate.task.validate_task``.
"""

from tasks.validate.config import ValidateConfig, ValidateGateConfig
from tasks.validate.filters import SIGNAL_FIELDS, ClassifierRule, FilterStats, apply_filters

__all__ = [
    "SIGNAL_FIELDS",
    "ClassifierRule",
    "FilterStats",
    "ValidateConfig",
    "ValidateGateConfig",
    "apply_filters",
]
