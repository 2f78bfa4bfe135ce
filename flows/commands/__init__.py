"""One module per ``tokenlake`` command group; each exposes ``register(subparsers)``."""
