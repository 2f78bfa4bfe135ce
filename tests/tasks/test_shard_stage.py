"""The shard stage over a real local repository: tokenizer, shards, manifest, gate, verification."""

from __future__ import annotations

import hashlib
import io
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import layout
from formats.shards import HEADER_SIZE, Manifest, read_shard_bytes
from tasks.gates import ExpectationsFailed
from tasks.parts import read_parts
from tasks.schema import document_id
from tasks.shard.config import ShardConfig
from tasks.shard.stage import run_shard
from tasks.shard.task import shard_task
from tasks.shard.verify import verify_shards_at
from tasks.stage import run_stage
from tasks.tokenize import TokenizerError, load_tokenizer, train_tokenizer
from versioning import DataRepo
from versioning.local import LocalRepo

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "this",
    "are",
    "or",
    "from",
    "at",
    "which",
    "def",
    "return",
]
SMALL = ShardConfig(vocab_size=400, seq_len=31, max_sequences_per_shard=40, batch_documents=64)


def dedup_table(source: str, texts: list[str | None], weights: list[float] | None = None) -> pa.Table:
    n = len(texts)
    return pa.table(
        {
            "id": [document_id(source, f"{source}.txt:{i}") for i in range(n)],
            "source": [source] * n,
            "text": pa.array(texts, pa.string()),
            "locator": [f"{source}.txt:{i}" for i in range(n)],
            "meta": ["{}"] * n,
            "dup_cluster": [""] * n,
            "cluster_size": [1] * n,
            "weight": weights or [1.0] * n,
        }
    )


def random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60))) for _ in range(n)]


def put_parts(repo: DataRepo, branch: str, source: str, tables: list[pa.Table]) -> None:
    for i, table in enumerate(tables):
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        repo.put(branch, f"safe/{source}/part-{i:05d}.parquet", buffer.getvalue())


def build_dedup_repo(root: Path) -> tuple[LocalRepo, str]:
    """A repository whose main holds dedup/ of three sources: web (2 parts), code, and empty."""
    repo = LocalRepo(root)
    repo.ensure()
    web = random_texts(400, seed=1)
    put_parts(repo, "main", "web", [dedup_table("web", web[:250]), dedup_table("web", web[250:])])
    put_parts(repo, "main", "code", [dedup_table("code", random_texts(150, seed=2))])
    put_parts(repo, "main", "empty", [dedup_table("empty", ["", None, "   "[:0]])])
    return repo, repo.commit("main", "dedup").id


def shard_on_branch(
    repo: DataRepo, input_commit: str, branch: str, config: ShardConfig = SMALL, start: str = "main"
):
    repo.create_branch(branch, start)
    return run_stage(run_shard, repo, branch, input_commit, config, flow_run_id="test-run")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    repo, input_commit = build_dedup_repo(tmp_path_factory.mktemp("shard") / "repo")
    result = shard_on_branch(repo, input_commit, "curate-1")
    yield repo, input_commit, result
    repo.close()


def source_documents(repo: DataRepo, ref: str, source: str) -> list[str]:
    return [t for table in read_parts(repo, ref, f"safe/{source}") for t in table.column("text").to_pylist()]


def test_decoded_shards_are_exactly_the_documents_token_stream(sharded) -> None:
    repo, input_commit, result = sharded
    manifest = Manifest.from_json(repo.get(result.commit_id, "shards/manifest.json"))
    tokenizer, eod = load_tokenizer(repo.get(result.commit_id, layout.TOKENIZER).decode(), SMALL.eod_token)
    for source in ("web", "code"):
        texts = source_documents(repo, input_commit, source)
        expected = [t for text in texts for t in [*tokenizer.encode(text).ids, eod]]
        rows = [read_shard_bytes(repo.get(result.commit_id, e.name))[1] for e in manifest.shards_of(source)]
        stream = np.concatenate(rows).ravel().tolist()
        dropped = result.report["per_source"][source]["tail_tokens_dropped"]
        assert stream == expected[: len(expected) - dropped] and 0 <= dropped <= SMALL.seq_len
        assert tokenizer.decode(stream[: stream.index(eod)]) == texts[0]


def test_manifest_report_and_commit_agree(sharded) -> None:
    repo, input_commit, result = sharded
    raw = repo.get(result.commit_id, "shards/manifest.json")
    manifest = Manifest.from_json(raw)
    tokenizer_sha = hashlib.sha256(repo.get(result.commit_id, layout.TOKENIZER)).hexdigest()
    metadata = repo.get_commit(result.commit_id).metadata
    assert manifest.tokenizer_sha256 == tokenizer_sha == metadata["tokenizer_sha256"]
    assert manifest.sha256() == hashlib.sha256(raw).hexdigest() == metadata["manifest_sha256"]
    assert (manifest.input_commit, metadata["input_commit"], metadata["stage"]) == (
        input_commit,
        input_commit,
        "shard",
    )
    assert manifest.dtype == "uint16" and manifest.seq_len == SMALL.seq_len and manifest.eod_token == 0
    assert set(manifest.sources) == {"web", "code"} and manifest.faults() == []
    for e in manifest.shards:
        data = repo.get(result.commit_id, e.name)
        assert hashlib.sha256(data).hexdigest() == e.sha256 and len(data) == e.bytes
        assert e.tokens == e.sequences * (SMALL.seq_len + 1) and len(data) == HEADER_SIZE + 2 * e.tokens
    report = json.loads(repo.get(result.commit_id, "reports/shard.json"))
    assert report["documents_in"] == 553 == report["kept"] + report["rejected_total"]
    assert report["expectations"]["success"] is True
    assert report["tokens"] == manifest.totals["tokens"]


def test_shard_sizes_are_balanced_within_each_source(sharded) -> None:
    repo, _, result = sharded
    manifest = Manifest.from_json(repo.get(result.commit_id, "shards/manifest.json"))
    for source in manifest.sources:
        sizes = [e.sequences for e in manifest.shards_of(source)]
        assert max(sizes) - min(sizes) <= 1 and max(sizes) <= SMALL.max_sequences_per_shard
    assert len(manifest.shards_of("web")) > 2


def test_an_empty_source_is_reported_not_sharded(sharded) -> None:
    repo, _, result = sharded
    per_source = result.report["per_source"]["empty"]
    assert per_source["shards"] == 0 and per_source["rejected"] == {"no_tokens": 3}
    assert "all 3 documents were rejected" in result.report["extra"]["sources_without_shards"]["empty"]
    quarantined = pa.concat_tables(read_parts(repo, result.commit_id, "quarantine/shard/empty"))
    assert quarantined.num_rows == 3 and set(quarantined.column("reason").to_pylist()) == {"no_tokens"}


def test_verify_passes_on_the_written_version(sharded) -> None:
    repo, _, result = sharded
    verification = verify_shards_at(repo, result.commit_id)
    assert verification.ok, verification.faulty
    assert len(verification.checks) == 2 + len(
        Manifest.from_json(repo.get(result.commit_id, "shards/manifest.json")).shards
    )


def test_verify_names_a_truncated_and_a_bit_flipped_shard(sharded) -> None:
    repo, _, result = sharded
    repo.create_branch("corrupt", result.commit_id)
    manifest = Manifest.from_json(repo.get(result.commit_id, "shards/manifest.json"))
    truncated, flipped = manifest.shards_of("web")[0].name, manifest.shards_of("code")[-1].name
    repo.put("corrupt", truncated, repo.get("corrupt", truncated)[:-7])
    data = bytearray(repo.get("corrupt", flipped))
    data[HEADER_SIZE + 5] ^= 0x10
    repo.put("corrupt", flipped, bytes(data))
    repo.put("corrupt", "shards/web/stray.bin", b"TLSHARD1")
    repo.commit("corrupt", "corrupt two shards")
    verification = verify_shards_at(repo, "corrupt")
    faults = {c.name: c.faults for c in verification.faulty}
    assert set(faults) == {truncated, flipped, "shards/web/stray.bin"}
    assert any(f.startswith("truncated") for f in faults[truncated])
    assert any("sha256" in f for f in faults[flipped])


def test_rerun_on_the_same_branch_replaces_outputs_and_reuse_keeps_the_tokenizer(sharded) -> None:
    repo, input_commit, result = sharded
    reuse = SMALL.model_copy(
        update={"reuse_tokenizer_from": result.commit_id, "max_sequences_per_shard": 1000}
    )
    again = shard_on_branch(
        repo, input_commit, "curate-2", reuse, start=result.commit_id
    )  # over the first run's output
    first = Manifest.from_json(repo.get(result.commit_id, "shards/manifest.json"))
    second = Manifest.from_json(repo.get(again.commit_id, "shards/manifest.json"))
    assert second.tokenizer_sha256 == first.tokenizer_sha256
    assert again.report["extra"]["tokenizer"]["origin"] == "reused"
    assert second.totals == first.totals and len(second.shards) < len(first.shards)
    assert not [o for o in repo.list(again.commit_id, "shards/") if o.path.endswith("shard-00003.bin")]


def test_reuse_from_a_ref_without_a_tokenizer_says_what_to_fix(sharded) -> None:
    repo, input_commit, _ = sharded
    config = SMALL.model_copy(update={"reuse_tokenizer_from": "main"})
    with pytest.raises(TokenizerError, match="reuse_tokenizer_from='main': no tokenizer/tokenizer.json"):
        shard_on_branch(repo, input_commit, "curate-3", config)


@pytest.mark.parametrize(("added", "dtype"), [(0, "uint16"), (1, "uint32")])
def test_dtype_switches_when_the_vocabulary_passes_65536(tmp_path, added: int, dtype: str) -> None:
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    put_parts(repo, "main", "web", [dedup_table("web", random_texts(40, seed=5))])
    tokenizer = train_tokenizer(random_texts(100, seed=5), 300, [SMALL.eod_token])
    fill = 65_536 + added - tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_tokens([f"<|unused-{i}|>" for i in range(fill)])
    repo.put("main", layout.TOKENIZER, tokenizer.to_str().encode())
    input_commit = repo.commit("main", "dedup + tokenizer").id
    result = shard_on_branch(
        repo, input_commit, "curate-1", SMALL.model_copy(update={"reuse_tokenizer_from": "main"})
    )
    manifest = Manifest.from_json(repo.get(result.commit_id, "shards/manifest.json"))
    assert (manifest.vocab_size, manifest.dtype) == (65_536 + added, dtype)
    header, _ = read_shard_bytes(repo.get(result.commit_id, manifest.shards[0].name))
    assert header.dtype.name == dtype
    assert verify_shards_at(repo, result.commit_id).ok


def test_a_version_with_no_tokens_at_all_fails_the_gate_and_commits_nothing(tmp_path) -> None:
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    put_parts(repo, "main", "web", [dedup_table("web", ["the of and"] * 3, [0.0] * 3)])
    put_parts(repo, "main", "notes", [dedup_table("notes", ["for it as", "to in"])])
    input_commit = repo.commit("main", "dedup").id
    repo.create_branch("curate-1", "main")
    config = SMALL.model_copy(update={"reuse_tokenizer_from": None, "seq_len": 1024})
    with pytest.raises(ExpectationsFailed, match="without shards cannot be trained on"):
        run_stage(run_shard, repo, "curate-1", input_commit, config)
    assert repo.resolve("curate-1") == input_commit


def test_missing_safety_output_fails_fast(tmp_path) -> None:
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    head = repo.resolve("main")
    with pytest.raises(ValueError, match="no documents under safe/ at commit .* run the safety stage first"):
        run_stage(run_shard, repo, "main", head, SMALL)


def test_a_part_without_a_text_column_is_named(tmp_path) -> None:
    repo = LocalRepo(tmp_path / "repo")
    repo.ensure()
    put_parts(repo, "main", "web", [pa.table({"id": ["a"], "body": ["x"]})])
    head = repo.commit("main", "bad dedup").id
    with pytest.raises(ValueError, match="safe/web/part-00000.parquet lacks column"):
        run_stage(run_shard, repo, "main", head, SMALL)


def test_the_task_wrapper_runs_the_stage_without_prefect(tmp_path) -> None:
    repo, input_commit = build_dedup_repo(tmp_path / "repo")
    repo.create_branch("curate-9", "main")
    result = shard_task.fn(str(tmp_path / "repo"), "curate-9", SMALL, input_commit, "flow-run-9")
    assert result.stage == "shard" and repo.resolve("curate-9") == result.commit_id
    assert repo.get_commit(result.commit_id).metadata["flow_run_id"] == "flow-run-9"


def test_config_refuses_unknown_fields_and_a_tiny_vocabulary() -> None:
    with pytest.raises(ValueError, match="vocab_sise"):
        ShardConfig(vocab_sise=10)
    with pytest.raises(ValueError, match="vocab_size must be at least 259"):
        ShardConfig(vocab_size=100, special_tokens=["<|pad|>"])
    with pytest.raises(ValueError, match="must be distinct"):
        ShardConfig(special_tokens=["<|endoftext|>"])


@pytest.mark.slow
def test_the_task_in_a_flow_leaves_table_and_progress_artifacts(prefect_harness, tmp_path) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    repo, input_commit = build_dedup_repo(tmp_path / "repo")
    repo.create_branch("curate-1", "main")

    @flow
    def shard_only():
        from prefect.runtime import flow_run

        return flow_run.id, shard_task(str(tmp_path / "repo"), "curate-1", SMALL, input_commit, flow_run.id)

    flow_run_id, result = shard_only()
    assert repo.get_commit(result.commit_id).metadata["flow_run_id"] == flow_run_id
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    by_type = {a.type: a for a in artifacts}
    assert by_type["progress"].data == 100
    table = json.loads(by_type["table"].data)
    assert by_type["table"].key == "shard-stage"
    rows = {row["source"]: row for row in table}
    assert set(rows) == {"web", "code", "empty", "(all)"}
    assert rows["web"]["stored_tokens"] > 0 and rows["empty"]["rejected"] == 3
    assert rows["empty"]["top reasons"] == "no_tokens: 3"
    assert rows["(all)"]["tokens"] == result.report["tokens"]
