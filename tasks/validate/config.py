"""Validate-stage configuration: rule bounds for prose and code, per-source overrides,
language identification, the quality classifier and the Great Expectations gate.

Per-source threshold overrides live here rather than on the ingest source, so tuning a filter
re-runs only this stage (the ingest config hash, hence its cache key, stays the same).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.gates import GateSettings
from tasks.quality.classifier import ClassifierConfig
from tasks.quality.code import CODE_RULES, CodeRules
from tasks.quality.langid import LangIdConfig
from tasks.quality.prose import PROSE_RULES, ProseRules
from tasks.quality.rules import Bounds

LANGUAGE_RULE = "language"
CLASSIFIER_RULE = "quality_classifier"
TOTAL = "total"
ALL_RULES = [*PROSE_RULES, *CODE_RULES, LANGUAGE_RULE, CLASSIFIER_RULE]


class ValidateGateConfig(GateSettings):
    """The Great Expectations gate on what validate wrote."""

    max_text_chars: int = Field(default=1_000_000, ge=1, description="Longest text the gate accepts.")
    default_removal_rate: Bounds = Field(
        default=Bounds(min=0.0, max=0.9), description="Share of a source's documents one rule may fail."
    )
    removal_rate: dict[str, Bounds] = Field(
        default_factory=lambda: {TOTAL: Bounds(min=0.0, max=0.95)},
        description="Per rule name (or 'total': all rules together) bounds that replace the default.",
    )

    @model_validator(mode="after")
    def _known_rules(self) -> ValidateGateConfig:
        unknown = sorted(set(self.removal_rate) - {*ALL_RULES, TOTAL})
        if unknown:
            raise ValueError(
                f"gate.removal_rate names unknown rules {unknown}; known: {', '.join(ALL_RULES)}, {TOTAL}"
            )
        return self

    def rate_range(self, rule: str) -> tuple[float, float]:
        """(min, max) share of a source's documents ``rule`` may fail ('total': all rules together)."""
        bounds = self.removal_rate.get(rule, self.default_removal_rate)
        return (bounds.min or 0.0, 1.0 if bounds.max is None else bounds.max)


class ValidateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prose: ProseRules = Field(default_factory=ProseRules)
    code: CodeRules = Field(default_factory=CodeRules)
    per_source: dict[str, dict[str, Bounds]] = Field(
        default_factory=dict, description="source name -> rule name -> bounds replacing the kind's default."
    )
    langid: LangIdConfig = Field(default_factory=LangIdConfig)
    classifier: ClassifierConfig = Field(default_factory=ClassifierConfig)
    gate: ValidateGateConfig = Field(default_factory=ValidateGateConfig)
    batch_rows: int = Field(default=1_000, ge=1, description="Documents whose signals are computed at once.")

    @model_validator(mode="after")
    def _known_rules(self) -> ValidateConfig:
        for source, overrides in self.per_source.items():
            unknown = sorted(set(overrides) - {*PROSE_RULES, *CODE_RULES})
            if unknown:
                raise ValueError(
                    f"per_source[{source!r}] names unknown rules {unknown}; "
                    f"prose rules: {', '.join(PROSE_RULES)}; code rules: {', '.join(CODE_RULES)}"
                )
        return self

    def rules_for(self, source: str, kind: str) -> dict[str, Bounds]:
        """The bounds of every rule of ``kind``, with the source's overrides applied."""
        rules = (self.prose if kind == "prose" else self.code).model_dump()
        bounds = {name: Bounds(**value) for name, value in rules.items()}
        overrides = self.per_source.get(source, {})
        return {name: overrides.get(name, bound) for name, bound in bounds.items()}
