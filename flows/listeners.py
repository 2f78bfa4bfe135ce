"""In-process listeners of a run's events: how an interactive command sees what the flows it runs
in this process report (stage progress, notices), besides the Prefect API."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Listeners:
    """Callables that each event is handed to, added for the length of a block (thread-safe)."""

    def __init__(self) -> None:
        self._listeners: list[Callable[..., None]] = []
        self._lock = threading.Lock()

    @contextmanager
    def listening(self, listener: Callable[..., None]) -> Iterator[None]:
        with self._lock:
            self._listeners.append(listener)
        try:
            yield
        finally:
            with self._lock:
                self._listeners.remove(listener)

    def send(self, *event: Any) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(*event)
