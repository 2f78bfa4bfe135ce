"""Language identification with py3langid, whose model ships inside the wheel (nothing is
downloaded). Scores are normalised probabilities; texts are cut to ``max_chars`` first because
py3langid walks its automaton one byte at a time in Python."""

from __future__ import annotations

from functools import cache
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field


class LangIdConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    kinds: list[Literal["prose", "code"]] = Field(default_factory=lambda: ["prose"])
    keep: list[str] | None = Field(
        default=None, description="Language codes to keep (e.g. ['en']); None computes the columns only."
    )
    min_score: float = Field(
        default=0.0, ge=0.0, le=1.0, description="With keep: also drop below this score."
    )
    max_chars: int = Field(default=1_000, ge=1, description="Characters of each document the model reads.")


@cache
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def known_languages() -> set[str]:
    return set(_identifier().labels)


def check_languages(config: LangIdConfig) -> None:
    """Fail fast on a language code the model does not know."""
    if config.enabled and config.keep:
        unknown = sorted(set(config.keep) - known_languages())
        if unknown:
            raise ValueError(f"langid.keep has language codes the model does not know: {', '.join(unknown)}")


def identify(texts: pa.Array, max_chars: int) -> tuple[pa.Array, np.ndarray]:
    """``(language codes, scores)`` for each text."""
    identifier = _identifier()
    heads = pc.utf8_slice_codeunits(pc.fill_null(texts, ""), 0, max_chars).to_pylist()
    results = [identifier.classify(head) if head.strip() else ("und", 0.0) for head in heads]
    return pa.array([r[0] for r in results], pa.string()), np.array([r[1] for r in results], dtype=np.float64)
