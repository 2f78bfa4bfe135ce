"""CurateParams: the one parameter of the curate flow, so the Prefect UI renders it as a form.

It nests each stage's own config model (the stages validate their parts), and adds the
publish gates, the repository and the retry policy. ``CurateParams.from_toml(path)`` reads
the same structure from a TOML file (see ``examples/curate.toml``); relative paths in that
file (source paths, a local repository) are taken relative to the file's directory.
"""

from __future__ import annotations

import importlib.util
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from flows.commands.values import one_sentence
from formats.mix import MixSpec
from tasks.dedup.config import DedupConfig
from tasks.ingest.config import IngestConfig
from tasks.safety.config import SafetyConfig
from tasks.shard.config import ShardConfig
from tasks.validate.config import ValidateConfig
from versioning.port import validate_repo_name


class RepositoryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: str | None = Field(
        default=None,
        description="a local directory or lakefs://REPOSITORY (lakectl configuration); "
        "default $TOKENLAKE_REPO, else the data home's repo folder",
    )
    results: str | None = Field(
        default=None,
        description="directory of cached stage results; default $TOKENLAKE_RESULTS, else the data home's results folder",
    )
    lakefs_ui: str | None = Field(
        default=None, description="lakeFS UI base URL for links in the summary; default the lakeFS endpoint"
    )

    @field_validator("spec")
    @classmethod
    def _lakefs_repository_name(cls, spec: str | None) -> str | None:
        # Checked here, so that a bad name fails the parameters instead of a run that started.
        if spec is not None and spec.startswith("lakefs://"):
            validate_repo_name(spec.removeprefix("lakefs://").strip("/"))
        return spec


class GateConfig(BaseModel):
    """What a run must achieve before it may publish; a failing gate leaves main untouched."""

    model_config = ConfigDict(extra="forbid")

    min_documents: int = Field(default=1, ge=0, description="documents packed into the shards, at least")
    min_tokens: int = Field(default=1, ge=0, description="tokens in the shards, at least")
    max_quarantined_fraction: float = Field(
        default=0.95,
        ge=0.0,
        le=1.0,
        description="share of ingested documents that may end in quarantine across all stages",
    )
    every_source_in_shards: bool = Field(
        default=True, description="fail when a configured source has no tokens in the shards"
    )
    expectations_must_pass: bool = Field(
        default=True, description="fail when a stage report carries failed Great Expectations results"
    )


class RetryConfig(BaseModel):
    """Retries of the stage tasks: Prefect's exponential backoff with jitter."""

    model_config = ConfigDict(extra="forbid")

    retries: int = Field(default=3, ge=0, description="retries of a failed stage or publish")
    backoff_seconds: float = Field(default=2.0, ge=0, description="first delay; doubles with each retry")
    jitter_factor: float = Field(
        default=0.5, ge=0, description="random extra delay, as a fraction of the delay"
    )

    def task_options(self) -> dict[str, Any]:
        """Prefect task options: ``retries`` delays of backoff_seconds, doubling
        (``prefect.tasks.exponential_backoff``), each plus up to jitter_factor of itself."""
        from prefect.tasks import exponential_backoff

        return {
            "retries": self.retries,
            "retry_delay_seconds": exponential_backoff(backoff_factor=self.backoff_seconds),
            "retry_jitter_factor": self.jitter_factor,
        }


class RunnerConfig(BaseModel):
    """Where the stages' partitions run (:mod:`flows.runners`); the published bytes are the same on each."""

    model_config = ConfigDict(extra="forbid")

    spec: str = Field(
        default="local",
        pattern=r"^(local|dask|dask:.+)$",
        description="local (this machine), dask (a Dask LocalCluster started for the run) or "
        "dask:tcp://host:8786 (an existing Dask scheduler, whose workers see the same repository)",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="local: partitions at once (1 runs them in the flow's process); dask: LocalCluster worker processes",
    )
    memory_limit: str = Field(
        default="auto",
        description="dask LocalCluster: memory per worker process, e.g. 2GiB ('auto' shares the machine's)",
    )
    dashboard: str | None = Field(
        default=None,
        description="dask LocalCluster: serve the Dask dashboard at this address, e.g. :8787 or "
        "127.0.0.1:8787, and print its URL (needs bokeh); default none",
    )

    @field_validator("memory_limit")
    @classmethod
    def _memory_limit_is_a_size(cls, value: str) -> str:
        from dask.utils import parse_bytes  # dask only where a runner is configured

        if value != "auto":
            try:
                parse_bytes(value)
            except ValueError:
                raise ValueError(
                    f"memory_limit {value!r} is not a size: write e.g. 2GiB, 512MB or auto"
                ) from None
        return value

    @model_validator(mode="after")
    def _dashboard_is_servable(self) -> RunnerConfig:
        if self.dashboard is None:
            return self
        if self.spec != "dask":
            raise ValueError(
                "dashboard is for a Dask LocalCluster started for the run (spec dask); "
                "an existing scheduler serves its own"
            )
        if importlib.util.find_spec("bokeh") is None:
            raise ValueError("dashboard needs bokeh, which Dask draws it with: pip install 'bokeh>=3.1'")
        return self


class CurateParams(BaseModel):
    """Everything one curate run needs: sources to publish, stage configs, gates, repository."""

    # populate_by_name: the field's own name works too where a validation alias is set
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    ingest: IngestConfig = Field(default_factory=IngestConfig, description="the sources and ingest limits")
    validation: ValidateConfig = Field(
        default_factory=ValidateConfig,
        # 'filters' is this field's name before 0.2: old TOML files and saved parameters still load
        validation_alias=AliasChoices("validation", "filters"),
        description="the validate stage: quality rules, language id, classifier, gate",
    )
    dedup: DedupConfig = Field(default_factory=DedupConfig, description="exact and near-duplicate removal")
    safety: SafetyConfig = Field(
        default_factory=SafetyConfig,
        description="the safety stage: benchmark decontamination, PII and secrets, URL blocklists",
    )
    shards: ShardConfig = Field(default_factory=ShardConfig, description="tokenizer and packing")
    mix: MixSpec = Field(default_factory=MixSpec, description="the mixture plan")
    gates: GateConfig = Field(default_factory=GateConfig, description="what must hold before publishing")
    repository: RepositoryConfig = Field(default_factory=RepositoryConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    runner: RunnerConfig = Field(
        default_factory=RunnerConfig, description="where the partitions of each stage run"
    )

    @classmethod
    def from_toml(cls, path: str | Path) -> CurateParams:
        path = Path(path)
        data = read_toml(path, "config file")
        return cls.from_dict(_relative_to(data, path.resolve().parent), where=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "parameters") -> CurateParams:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"{where}: {one_sentence(exc)}") from None


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The TOML of ``path``; a missing file or bad TOML is one sentence naming ``what`` and the file."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None


def check_ready(params: CurateParams, repo_spec: str) -> None:
    """What can fail before any work, failing fast with one sentence: the sources, the
    benchmark and blocklist files, the mix's source names, the repository."""
    from tasks.ingest import check_source
    from tasks.safety import check_files
    from tasks.stage import ConfigError
    from versioning import open_repo

    if not params.ingest.sources:
        raise ConfigError("no sources to curate: add at least one [[ingest.sources]] entry")
    for source in params.ingest.sources:
        check_source(source)
    check_files(params.safety)
    names = {s.name for s in params.ingest.sources}
    for where, weights in [("mix.weights", params.mix.weights)] + [
        (f"mix.phases[{i}].weights", phase.weights) for i, phase in enumerate(params.mix.phases)
    ]:
        unknown = sorted(set(weights or {}) - names)
        if unknown:
            raise ConfigError(
                f"{where} names {', '.join(unknown)}, not among the sources ({', '.join(sorted(names))})"
            )
    open_repo(repo_spec).list_branches()  # reachable, and created when new


def _relative_to(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Source, benchmark and blocklist paths and a local repository path written relative to the TOML file."""

    def resolve(value: str) -> str:
        expanded = Path(value).expanduser()
        return os.path.normpath(expanded if expanded.is_absolute() else base / expanded)

    for source in data.get("ingest", {}).get("sources", []):
        if isinstance(source, dict) and isinstance(source.get("path"), str):
            source["path"] = resolve(source["path"])
    safety = data.get("safety", {})
    listed = [
        *(safety.get("decontamination", {}).get("benchmarks", [])),
        *(safety.get("blocklist", {}).get("lists", [])),
    ]
    for entry in listed:
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            entry["path"] = resolve(entry["path"])
    repository = data.get("repository", {})
    for key in ("spec", "results"):
        value = repository.get(key)
        if isinstance(value, str) and value and not value.startswith("lakefs://"):
            repository[key] = resolve(value.removeprefix("local://"))
    return data
