"""The trainer's user-facing errors: each message is one sentence saying what to fix."""


class TrainingError(RuntimeError):
    """A run that cannot start or go on as configured (bad data, no usable checkpoint, divergence)."""
