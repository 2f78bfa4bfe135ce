"""Ingest configuration: the sources to read and the limits that decide what is quarantined.

Pydantic models with ``extra="forbid"`` (an unknown key fails with the key's name) and defaults
a newcomer can run. :func:`check_sources` checks what can only be checked on disk (paths
exist, something matches the globs, the text field exists) before any work starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.gates import GateSettings

SOURCE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"
MiB = 1 << 20


class SourceConfig(BaseModel):
    """One input source.

    ``path`` is a directory (every file under it that matches ``include`` and no ``exclude``)
    or a single file. Globs are ``fnmatch`` patterns matched against the path relative to
    ``path``, where ``*`` also matches ``/`` (so ``*.py`` matches ``a/b/c.py``).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SOURCE_NAME_PATTERN, description="Folder name under raw/ and filtered/.")
    kind: Literal["prose", "code"] = Field(description="Which quality rules apply in the validate stage.")
    format: Literal["files", "jsonl", "parquet", "warc", "html"] = Field(
        description="files: one document per file; jsonl: one per line (.jsonl, .gz, .zst); parquet: one per row; "
        "warc: one per HTML or text response record (.warc, .warc.gz), main text extracted; "
        "html: one page per file, main text extracted."
    )
    path: str = Field(description="A directory or a single file.")
    include: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    exclude: list[str] = Field(
        default_factory=lambda: [".git/*", "*/.git/*", "__pycache__/*", "*/__pycache__/*"]
    )
    text_field: str = Field(
        default="text", min_length=1, description="JSONL key or Parquet column of the text."
    )
    id_field: str | None = Field(
        default=None,
        description="JSONL key or Parquet column holding the source's own document id; "
        "when set, the document id hashes it instead of the locator, so it survives re-splitting files.",
    )
    url_field: str | None = Field(
        default="url",
        description="JSONL key or Parquet column of the document's URL, kept as meta.url (what the safety "
        "stage's blocklists match); records without it simply have no URL. None: do not look.",
    )
    reference: bool = Field(
        default=False, description="Documents of this source are positives for the quality classifier."
    )
    min_chars: int = Field(
        default=1, ge=1, description="Shorter documents (after normalisation) are too_short."
    )
    max_chars: int = Field(default=1_000_000, ge=1, description="Longer documents are too_long.")

    @model_validator(mode="after")
    def _check(self) -> SourceConfig:
        if self.min_chars > self.max_chars:
            raise ValueError(
                f"source {self.name!r}: min_chars ({self.min_chars}) exceeds max_chars ({self.max_chars})"
            )
        if self.format in ("files", "warc", "html") and self.id_field is not None:
            raise ValueError(
                f"source {self.name!r}: id_field applies to jsonl and parquet sources; "
                f"remove it for format {self.format!r}"
            )
        return self


class IngestGateConfig(GateSettings):
    """The Great Expectations gate on what ingest wrote (expectations/raw_documents.json)."""

    max_quarantine_rate: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Fail when one reason quarantines more than this share of a source.",
    )


class IngestConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sources: list[SourceConfig] = Field(default_factory=list)
    partition_bytes: int = Field(
        default=16 * MiB,
        ge=1,
        description="Input bytes per unit of work (file group, JSONL byte range, row groups); "
        "each partition is one Prefect task and writes one raw/SOURCE/part-NNNNN.parquet.",
    )
    max_files_per_partition: int = Field(default=5_000, ge=1)
    max_doc_bytes: int = Field(
        default=16 * MiB,
        ge=1,
        description="A document (file, line, value) larger than this is quarantined as too_long without being held in memory.",
    )
    binary_control_fraction: float = Field(
        default=0.05,
        gt=0.0,
        le=1.0,
        description="Share of control bytes in the first 8 KiB above which content is binary.",
    )
    quarantine_text_chars: int = Field(
        default=10_000, ge=0, description="How much of a rejected document's text the quarantine keeps."
    )
    partition_retries: int = Field(
        default=2, ge=0, description="Retries of one failing partition before the stage fails."
    )
    gate: IngestGateConfig = Field(default_factory=IngestGateConfig)

    @model_validator(mode="after")
    def _unique_names(self) -> IngestConfig:
        names = [s.name for s in self.sources]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"source names must be unique; rename the duplicates: {', '.join(duplicates)}")
        return self
