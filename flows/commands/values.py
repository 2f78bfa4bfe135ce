"""Values from the command line and config files, and their errors as one sentence: a value
out of range names the flag (argparse adds it) or the config key, and the range. Imports
nothing heavy: a typo is reported before Prefect or torch load."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from pydantic import ValidationError


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


def one_sentence(exc: ValidationError) -> str:
    """The first validation error as 'field.path: message' (there is usually one)."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "(top level)"
    message = error["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {message}{more}"


def flag_sentence(exc: ValidationError, flags: dict[str, str] | None = None) -> str:
    """:func:`one_sentence` for values given as command-line flags: the field ``max_restarts``
    is named ``--max-restarts`` (``flags`` maps fields whose flag is named otherwise)."""
    field = str(exc.errors()[0]["loc"][0]) if exc.errors()[0]["loc"] else ""
    flag = (flags or {}).get(field, "--" + field.replace("_", "-"))
    text = one_sentence(exc)
    if not field:
        return text
    rest = text.removeprefix(field)  # ": message", or ".nested.field: message"
    return f"{flag} {rest[1:]}" if rest.startswith(".") else f"{flag}{rest}"
