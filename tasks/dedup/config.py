"""DedupConfig: the parameters of the dedup stage, with defaults a newcomer can run."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.dedup.minhash import RENSA_ALGORITHM, choose_banding
from tasks.dedup.shingles import MAX_NGRAM, SHINGLE_VERSION


class DedupConfig(BaseModel):
    """Exact and near-duplicate removal (or soft down-weighting) of ``filtered/`` into ``dedup/``.

    Defaults: word 5-gram shingles (long enough that shared boilerplate phrases do not make
    documents similar, short enough that a few edits leave most shingles intact), Jaccard
    threshold 0.8 (the common choice for web text and code, e.g. in The Pile, SlimPajama and
    The Stack), 256 permutations (the verification estimate's standard deviation is then
    <= 0.031, so pairs 0.1 below the threshold pass it with probability < 1e-3), and the
    banding chosen from the threshold by :func:`tasks.dedup.minhash.choose_banding`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(
        0.8, gt=0.0, le=1.0, description="Jaccard similarity that makes a near duplicate"
    )
    ngram: int = Field(5, ge=1, le=MAX_NGRAM, description="words per shingle")
    num_perm: int = Field(256, ge=8, le=2048, description="MinHash permutations (signature length)")
    bands: int | None = Field(None, ge=1, description="LSH bands; with rows, overrides the automatic choice")
    rows: int | None = Field(None, ge=1, description="signature values per band")
    seed: int = Field(1, ge=0, description="seed of the MinHash permutations")
    mode: Literal["remove", "soft"] = Field(
        "remove", description="remove: keep one per cluster; soft: keep all, weight = cluster_size^-exponent"
    )
    soft_weight_exponent: float = Field(
        1.0, gt=0.0, description="soft mode: weight = cluster_size ** -exponent"
    )
    quality_column: str = Field(
        "quality_score",
        min_length=1,
        description="higher is better; picks each cluster's survivor if present",
    )
    bucket_window: int = Field(
        64, ge=1, description="in an LSH bucket, each document is compared with the next N"
    )
    buckets: int = Field(
        4,
        ge=1,
        le=1 << 16,
        description="hash buckets of the dedup shuffle: each worker holds about 1/buckets of the "
        "signatures and band keys; raise it with the corpus (results do not depend on it)",
    )
    slice_bytes: int = Field(
        16 << 20,
        ge=1 << 10,
        description="Parquet bytes of a bucket that a worker holds at once: a bucket step whose "
        "inputs are larger works through them in slices (results do not depend on it)",
    )
    batch_bytes: int = Field(
        1 << 20,
        ge=1 << 12,
        description="text hashed per vectorised batch (1 MiB keeps arrays cache- and allocator-friendly)",
    )

    @model_validator(mode="after")
    def _check(self) -> DedupConfig:
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both bands and rows, or neither to choose them from the threshold")
        if self.bands is not None and self.bands * self.rows > self.num_perm:  # type: ignore[operator]
            raise ValueError(f"bands x rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")  # type: ignore[operator]
        return self

    @property
    def banding(self) -> tuple[int, int]:
        if self.bands is not None and self.rows is not None:
            return self.bands, self.rows
        return choose_banding(self.threshold, self.num_perm)

    def signature_parameters(self) -> dict[str, int]:
        """What a stored signature depends on; signatures compare only when all of these agree."""
        return {
            "ngram": self.ngram,
            "num_perm": self.num_perm,
            "seed": self.seed,
            "shingle_version": SHINGLE_VERSION,
            "rensa_algorithm": RENSA_ALGORITHM,
        }

    def signature_key(self) -> str:
        """Short name of :meth:`signature_parameters`: the folder of the index that fits this config."""
        canonical = json.dumps(self.signature_parameters(), sort_keys=True).encode()
        return "sig-" + hashlib.sha256(canonical).hexdigest()[:12]
