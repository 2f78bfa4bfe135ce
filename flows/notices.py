"""What a user must read from inside a run, said where they look: the Prefect run's log (the UI's
Logs tab, a deployment's worker) and the console of an interactive ``tokenlake`` command.

The stdlib logger reached neither: Prefect sends only its run loggers to the API, and an
interactive command's Prefect console handler passes only CRITICAL (``flows/cli.py``), so a
warning there would drown in INFO lines. The command shows notices itself (:func:`to_console`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from flows.listeners import Listeners

Console = Callable[[int, str], None]
_consoles = Listeners()


def to_console(show: Console) -> AbstractContextManager[None]:
    """``show(level, message)`` for every notice of this process while the block runs."""
    return _consoles.listening(show)


def notice(message: str, level: int = logging.WARNING, logger: Any = None) -> None:
    """Say ``message`` to the current run's log (``logger``: a run's logger where no run context
    is active, as in a flow's state hook) and to the consoles showing notices."""
    (logger or _run_logger()).log(level, message)
    _consoles.send(level, message)


def _run_logger() -> Any:
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:  # called outside any run: the plain logger is all there is
        return logging.getLogger("tokenlake")
