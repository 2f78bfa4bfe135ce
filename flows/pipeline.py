"""The whole pipeline as DESIGN.md draws it: curate a dataset version, then train on it.

curate  (sources -> ... -> publish: merge into main + tag)   -> PublishedVersion
train   (on the commit id that publish made, never on a moving ref)
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

from flows.curate import curate
from flows.params import CurateParams
from flows.train import TrainParams, TrainSummary, train_flow
from flows.wap import PublishedVersion
from versioning import default_repo_spec


class PipelineParams(BaseModel):
    """The pipeline's parameters: the curate run's and the training run's (one form in the UI)."""

    model_config = ConfigDict(extra="forbid")

    curate: CurateParams = Field(default_factory=CurateParams)
    train: TrainParams = Field(
        default_factory=TrainParams,
        description="the training run; its dataset is always the commit this pipeline publishes",
    )


class PipelineResult(BaseModel):
    version: dict[str, Any]
    training: TrainSummary

    @property
    def published(self) -> PublishedVersion:
        return PublishedVersion(**self.version)


@flow(name="pipeline", log_prints=True)
def pipeline(params: PipelineParams = PipelineParams()) -> PipelineResult:
    """Curate, then train on the exact commit the curate run published."""
    version = curate(params.curate)
    train = params.train.model_copy(
        update={"dataset": version.commit_id, "repo": params.curate.repository.spec or default_repo_spec()}
    )
    training = train_flow(train)
    print(f"trained {training.run} to step {training.step} on {version.tag} ({version.commit_id})")
    return PipelineResult(version=asdict(version), training=training)
