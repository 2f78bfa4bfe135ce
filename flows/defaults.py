"""Defaults that the ``tokenlake`` help shows and the flows use: one definition, in a module the
command line imports at start without importing the flows (and Prefect) behind them."""

DEFAULT_STEPS = 300  # the train flow's, its deployment's and the demo's: one default
