"""The trainer's user-facing errors: each message is one sentence saying what to fix."""

# the exit status of a trainer that stopped on a TrainingError, after printing "training: error: <sentence>"
REFUSED_EXIT = 2


class TrainingError(RuntimeError):
    """A run that cannot start or go on as configured (bad data, no usable checkpoint, divergence)."""
