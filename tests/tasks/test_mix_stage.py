"""The mix stage over a real local repository: manifest in, mix.json and report out, one commit."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from pydantic import ValidationError

from formats.layout import MIX
from formats.mix import MixPhase, MixPlan, MixSpec, MixSpecError
from formats.shards import HEADER_SIZE, Manifest, ShardEntry
from tasks.mix.stage import run_mix
from tasks.mix.task import mix_task
from tasks.stage import run_stage
from tasks.stage_task import stage_table
from versioning.local import LocalRepo

SEQ_LEN = 64


def manifest(sequences: dict[str, int]) -> Manifest:
    entries = [
        ShardEntry(
            name=f"shards/{source}/shard-00000.bin",
            source=source,
            sha256="0" * 64,
            sequences=n,
            tokens=n * (SEQ_LEN + 1),
            bytes=HEADER_SIZE + n * (SEQ_LEN + 1) * 2,
        )
        for source, n in sequences.items()
    ]
    return Manifest.build(
        entries,
        seq_len=SEQ_LEN,
        dtype="uint16",
        vocab_size=4096,
        eod_token=0,
        tokenizer_sha256="1" * 64,
        input_commit="c" * 64,
    )


@pytest.fixture
def repo(tmp_path):
    created = LocalRepo(tmp_path / "repo")
    created.ensure()
    yield created
    created.close()


def shard_commit(repo, sequences: dict[str, int]) -> tuple[str, Manifest]:
    written = manifest(sequences)
    repo.put("main", "shards/manifest.json", written.to_json().encode())
    return repo.commit("main", "shard", {"stage": "shard"}).id, written


def test_mix_stage_writes_the_resolved_plan_and_commits_it(repo, tmp_path):
    input_commit, written = shard_commit(repo, {"web": 6000, "code": 1500, "books": 500})
    spec = MixSpec(
        phases=[MixPhase(until_tokens=2000 * SEQ_LEN, temperature=1.0), MixPhase(temperature=3.0)],
        total_tokens=10_000 * SEQ_LEN,
        seed=7,
    )
    result = mix_task.fn(str(tmp_path / "repo"), "main", spec, input_commit, "flow-1")

    raw = repo.get(result.commit_id, MIX)
    plan = MixPlan.from_json(raw)
    assert plan.sha256() == hashlib.sha256(raw).hexdigest() == result.report["extra"]["mix_sha256"]
    assert plan.source_names == ("books", "code", "web") and plan.seed == 7
    assert plan.total_samples == 10_000 and sum(plan.samples) == 10_000
    assert [(p.start, p.stop) for p in plan.phases] == [(0, 2000), (2000, 10_000)]
    assert plan.source_sequences == (500, 1500, 6000)

    report = json.loads(repo.get(result.commit_id, "reports/mix.json"))
    assert report["tokens"] == 10_000 * SEQ_LEN
    assert report["per_source"]["books"]["epochs"] == pytest.approx(plan.samples[0] / 500, abs=1e-4)
    assert report["extra"]["manifest_sha256"] == written.sha256()
    commit = repo.get_commit(result.commit_id)
    assert commit.metadata["stage"] == "mix" and commit.metadata["mix_sha256"] == plan.sha256()
    assert commit.metadata["input_commit"] == input_commit and commit.metadata["flow_run_id"] == "flow-1"
    assert commit.message == f"mix: 10000 samples over 3 sources, mix {plan.sha256()[:12]}", (
        "not 'kept 0 of 0'"
    )
    total = stage_table(result.report)[-1]
    assert total["source"] == "(all)" and total["tokens"] == 10_000 * SEQ_LEN
    assert "documents_in" not in total and "kept" not in total, "mix reads no documents: no '0 in, 0 kept'"
    source, _, _ = plan.locate(np.arange(plan.total_samples))
    assert np.array_equal(np.bincount(source, minlength=3), plan.samples)


def test_a_spec_that_cannot_be_met_fails_before_writing_anything(repo):
    input_commit, _ = shard_commit(repo, {"web": 6000, "code": 100})
    spec = MixSpec(weights={"web": 0.5, "code": 0.5}, total_tokens=2000 * SEQ_LEN, max_epochs=2)
    with pytest.raises(MixSpecError, match="source 'code' would need 10.00 epochs"):
        run_stage(run_mix, repo, "main", input_commit, spec)
    assert not repo.exists("main", MIX) and repo.resolve("main") == input_commit
    with pytest.raises(MixSpecError, match="name source 'books', which is not in the manifest"):
        run_stage(
            run_mix, repo, "main", input_commit, MixSpec(weights={"web": 0.5, "code": 0.25, "books": 0.25})
        )
    with pytest.raises(ValidationError, match="weights in the spec sum to 0.75, not 1"):
        MixSpec(weights={"web": 0.5, "code": 0.25})


def test_mix_stage_needs_a_manifest(repo):
    with pytest.raises(ValueError, match="no shards/manifest.json at commit .*; run the shard stage first"):
        run_stage(run_mix, repo, "main", repo.resolve("main"), MixSpec())
