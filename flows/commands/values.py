"""Command-line value types: a value out of range fails as one sentence that names the flag
(argparse adds it) and the range, as a config file's value does."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(minimum: int, meaning: str = "") -> Callable[[str], int]:
    """An int >= ``minimum``; ``meaning`` says what the smallest value does, where it is special."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}{meaning}, got {value}")
        return value

    return parse


def positive_number(text: str) -> float:
    """A float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value
