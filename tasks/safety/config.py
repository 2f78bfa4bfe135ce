"""Safety-stage configuration: benchmark decontamination, PII and secrets, URL blocklists.

Every check is off until configured (no benchmark, no list, ``pii.enabled = false``), so a
newcomer's config runs as before; :func:`tasks.safety.check_files` checks on disk what the
models cannot (files exist, the named fields are there) before any work starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"

PII_TYPES = ("email", "ip_address", "phone", "card_number")
SECRET_TYPES = ("aws_key", "private_key", "token", "secret")
ALL_TYPES = (*PII_TYPES, *SECRET_TYPES)
Mode = Literal["redact", "quarantine", "off"]


def _unique(names: list[str], what: str) -> None:
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{what} names must be unique; rename {', '.join(duplicates)}")


class BenchmarkConfig(BaseModel):
    """One evaluation set: a JSONL or Parquet file whose ``fields`` hold an item's text."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Folder name under eval_sets/; named in details.")
    path: str = Field(description="A .jsonl (.jsonl.gz) or .parquet file, one benchmark item per record.")
    fields: list[str] = Field(
        min_length=1,
        description="Keys or columns whose text is an item (strings, or lists of strings such as choices), joined.",
    )
    id_field: str | None = Field(
        default=None, description="Key or column of the item id named in details; default the record number."
    )

    @property
    def format(self) -> str:
        return "parquet" if Path(self.path).suffix == ".parquet" else "jsonl"


class DecontaminationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    benchmarks: list[BenchmarkConfig] = Field(default_factory=list)
    ngram: int = Field(default=13, ge=3, le=64, description="Words per n-gram a document may not share.")
    mode: Literal["quarantine", "remove"] = Field(
        default="quarantine",
        description="quarantine: the document goes to quarantine as contaminated; "
        "remove: the matching spans are cut out and the rest is kept.",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> DecontaminationConfig:
        _unique([b.name for b in self.benchmarks], "benchmark")
        return self


def _default_modes() -> dict[str, Mode]:
    return {**dict.fromkeys(PII_TYPES, "redact"), **dict.fromkeys(SECRET_TYPES, "quarantine")}


class PiiConfig(BaseModel):
    """Personal data (email, IP address, phone, payment card) and credentials (AWS keys,
    private-key blocks, tokens with known prefixes, high-entropy values of secret-like names)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=False, description="Scan every document for the types below.")
    modes: dict[str, Mode] = Field(
        default_factory=_default_modes,
        description="type -> redact (a typed placeholder: the type in capitals between angle brackets, document kept), quarantine, or off; "
        "types not named keep their default (personal data redacted, credentials quarantined).",
    )
    allow_email_domains: list[str] = Field(
        default_factory=lambda: ["example.com", "example.org", "example.net"],
        description="Addresses at these domains (and their subdomains) are left alone (RFC 2606 names by default).",
    )
    min_secret_entropy: float = Field(
        default=3.0, ge=0.0, description="Bits per character a value of a secret-like name needs to count."
    )
    min_secret_chars: int = Field(
        default=8, ge=1, description="Shorter values of secret-like names are ignored."
    )

    @model_validator(mode="after")
    def _known_types(self) -> PiiConfig:
        unknown = sorted(set(self.modes) - set(ALL_TYPES))
        if unknown:
            raise ValueError(f"pii.modes names unknown types {unknown}; known: {', '.join(ALL_TYPES)}")
        self.modes = _default_modes() | self.modes
        return self

    def active(self) -> dict[str, str]:
        """type -> mode of every type that is scanned."""
        return {t: m for t, m in self.modes.items() if m != "off"} if self.enabled else {}


class BlocklistFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="Committed as blocklists/NAME.txt (NAME: this name).")
    path: str = Field(description="A text file, one entry a line, '#' starts a comment.")
    kind: Literal["domains", "urls"] = Field(
        description="domains: a host and all its subdomains; urls: a host and a path prefix (host/path)."
    )


class BlocklistConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lists: list[BlocklistFile] = Field(default_factory=list)
    url_key: str = Field(
        default="url", min_length=1, description="Key of the document's URL in its meta JSON."
    )

    @model_validator(mode="after")
    def _unique_names(self) -> BlocklistConfig:
        _unique([b.name for b in self.lists], "blocklist")
        return self


class SafetyConfig(BaseModel):
    """The safety stage, between dedup and shard: what may not reach the shards."""

    model_config = ConfigDict(extra="forbid")

    decontamination: DecontaminationConfig = Field(default_factory=DecontaminationConfig)
    pii: PiiConfig = Field(default_factory=PiiConfig)
    blocklist: BlocklistConfig = Field(default_factory=BlocklistConfig)
    batch_rows: int = Field(default=1_000, ge=1, description="Documents checked at once.")

    @property
    def checks_anything(self) -> bool:
        return bool(self.decontamination.benchmarks or self.pii.active() or self.blocklist.lists)
