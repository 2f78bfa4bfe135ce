"""tokenlake on a real lakeFS against the storage's own limit and against the local repository.

One run starts MinIO and lakeFS v1.84.0 (built by ``./dev services``; lakeFS's KV store embedded,
MinIO its S3 blockstore, both on 127.0.0.1) and measures, rounds interleaved, best of each:

* upload: one large object (default 256 MiB, from a file) through ``LakeFSRepo.put`` as it
  uploads by default on S3 (pre-signed: lakeFS hands out a physical address, the client PUTs the
  bytes to S3 itself and links them), through the lakeFS API (``presign_uploads=False``: lakeFS
  receives the bytes and writes them to S3), and straight into MinIO (boto3 ``upload_file``:
  multipart, 8 MiB parts, 10 threads: the store's own rate);
* commit latency with 1k, 10k and 100k staged objects (64 bytes each, staged by 16 threads;
  the staging rate is printed too);
* a curate publish of the same demo corpus through the flow (a running ephemeral Prefect API) on
  ``lakefs://`` against the local repository;
* the shard streaming read rate: every shard of a synthetic dataset fetched and verified through
  the trainer's ``ShardCache`` (what the loader does before a batch needs a shard) from lakeFS
  against the local repository.

    .venv/bin/python benchmarks/lakefs_io.py [--upload-mib 256] [--rounds 3] [--commit-sizes 1000,10000,100000]

Results go to benchmarks/results/lakefs_io.json. Last line:
``lakefs_io: upload_vs_s3=<x> commit_100k_s=<y> publish_vs_local=<z> stream_vs_local=<w>``
(rates as adapter/baseline, so 1.0 is the baseline's speed and higher is faster; ``publish_vs_local``
is local seconds over lakeFS seconds, likewise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect" / "benchmark"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


from flows.services.lakefs import LakeFSServer  # noqa: E402
from flows.services.local_lakefs import LakeFSOnS3  # noqa: E402
from flows.services.minio import MinIOServer  # noqa: E402
from versioning.lakefs import LakeFSRepo  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MiB = 1024 * 1024


def connect(server: LakeFSServer, name: str, **options) -> LakeFSRepo:
    creds = server.credentials
    repo = LakeFSRepo.connect(
        creds.endpoint,
        creds.access_key_id,
        creds.secret_access_key,
        name,
        storage_namespace=server.storage_namespace(f"bench/{name}"),
        **options,
    )
    repo.ensure()
    return repo


def random_file(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        for _ in range(size // MiB):
            f.write(os.urandom(MiB))
    return path


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_upload(server: LakeFSServer, minio: MinIOServer, work: Path, mib: int, rounds: int) -> dict:
    source = random_file(work / "large.bin", mib * MiB)
    name = f"upload-{uuid.uuid4().hex[:8]}"
    presigned = connect(server, name)
    through_api = connect(server, name, presign_uploads=False)
    s3 = minio.endpoint.client()
    sides = {
        "presigned": lambda n: presigned.put("main", f"presigned-{n}.bin", source),
        "through_api": lambda n: through_api.put("main", f"through-api-{n}.bin", source),
        "direct_s3": lambda n: s3.upload_file(str(source), minio.bucket, f"direct/{uuid.uuid4().hex}.bin"),
    }
    assert presigned._presigned(), "lakeFS on S3 offers pre-signed uploads"
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    for n in range(rounds):
        order = list(sides) if n % 2 == 0 else list(reversed(sides))
        for side in order:
            seconds[side].append(timed(partial(sides[side], n)))
        print(f"upload round {n + 1}: " + ", ".join(f"{s} {seconds[s][-1]:.2f} s" for s in sides), flush=True)
    assert presigned.get("main", "presigned-0.bin") == source.read_bytes()
    best = {side: min(values) for side, values in seconds.items()}
    return {
        "mib": mib,
        "seconds": {side: round(v, 3) for side, v in best.items()},
        "mib_per_s": {side: round(mib / v, 1) for side, v in best.items()},
        "adapter_vs_s3": round(best["direct_s3"] / best["presigned"], 3),
        "through_api_vs_s3": round(best["direct_s3"] / best["through_api"], 3),
    }


def stage_objects(repo: LakeFSRepo, count: int) -> None:
    payload = b"x" * 64
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: repo.put("main", f"objects/{i:07d}", payload), range(count)))


def bench_commits(server: LakeFSServer, sizes: list[int]) -> dict:
    found = {}
    for size in sizes:
        repo = connect(server, f"commit-{size}-{uuid.uuid4().hex[:6]}")
        staged = timed(partial(stage_objects, repo, size))
        commit = timed(partial(repo.commit, "main", f"{size} objects"))
        assert len(list(repo.list("main", "objects/"))) == size
        found[str(size)] = {
            "stage_seconds": round(staged, 2),
            "staged_per_s": round(size / staged, 1),
            "commit_seconds": round(commit, 3),
        }
        print(
            f"commit of {size} staged objects: {commit:.3f} s (staged at {size / staged:.0f}/s)", flush=True
        )
    return found


def bench_publish(server: LakeFSServer, work: Path, code_mb: float, prose_mb: float, rounds: int) -> dict:
    from prefect import flow

    from flows.curate import curate
    from flows.demo_sources import MB, DemoBudget, demo_sources
    from flows.params import CurateParams, GateConfig, RepositoryConfig
    from tasks.ingest.config import IngestConfig

    creds = server.credentials
    os.environ.update(creds.lakectl_environment())
    os.environ["TOKENLAKE_LAKEFS_STORAGE_NAMESPACE"] = server.storage_namespace("bench-publish")
    os.environ["TOKENLAKE_HOME"] = str(work / "home")
    budget = DemoBudget(int(code_mb * MB), int(prose_mb * MB * 2 / 3), int(prose_mb * MB / 3))
    sources = demo_sources(work / "sources", budget)
    params = CurateParams(
        ingest=IngestConfig(sources=sources),
        gates=GateConfig(min_documents=1, min_tokens=1, max_quarantined_fraction=1.0),
    )

    @flow(name="benchmark-warm-up")
    def warm_up() -> None:
        """Starts the ephemeral API before anything is timed."""

    warm_up()
    seconds: dict[str, list[float]] = {"local": [], "lakefs": []}
    for n in range(rounds):
        specs = {
            "local": str(work / f"publish-local-{n}"),
            "lakefs": f"lakefs://publish-{uuid.uuid4().hex[:8]}",
        }
        order = ["local", "lakefs"] if n % 2 == 0 else ["lakefs", "local"]
        for side in order:
            run = params.model_copy(
                update={
                    "repository": RepositoryConfig(
                        spec=specs[side], results=str(work / f"results-{side}-{n}")
                    )
                }
            )
            seconds[side].append(timed(partial(publish, curate, run)))
        print(
            f"publish round {n + 1}: local {seconds['local'][-1]:.1f} s, lakeFS {seconds['lakefs'][-1]:.1f} s",
            flush=True,
        )
    best = {side: min(v) for side, v in seconds.items()}
    return {
        "code_mb": code_mb,
        "prose_mb": prose_mb,
        "seconds": {side: round(v, 2) for side, v in best.items()},
        "lakefs_vs_local": round(best["local"] / best["lakefs"], 3),
    }


def publish(curate, params) -> None:
    assert curate(params).new, "each round publishes into a fresh repository"


def fetch_all(cache, repo, commit: str, manifest) -> None:
    for entry in manifest.shards:
        cache.fetch(repo, commit, entry)


def bench_stream(server: LakeFSServer, work: Path, rounds: int) -> dict:
    from formats.shards import Manifest
    from training.shard_cache import ShardCache
    from training.synthetic import publish_synthetic_dataset

    sources = {"web": 60000, "code": 40000}
    local = LocalRepo(work / "stream-local")
    local.ensure()
    remote = connect(server, f"stream-{uuid.uuid4().hex[:8]}")
    commits = {
        name: publish_synthetic_dataset(
            repo, "main", sources, seq_len=1024, vocab_size=50304, shards_per_source=16, total_samples=100000
        )
        for name, repo in (("local", local), ("lakefs", remote))
    }
    repos = {"local": local, "lakefs": remote}
    manifest = Manifest.model_validate_json(local.get(commits["local"], "shards/manifest.json"))
    total = sum(e.bytes for e in manifest.shards)
    seconds: dict[str, list[float]] = {"local": [], "lakefs": []}
    for n in range(rounds):
        for side in ["local", "lakefs"] if n % 2 == 0 else ["lakefs", "local"]:
            cache = ShardCache(work / f"cache-{side}-{n}")
            seconds[side].append(timed(partial(fetch_all, cache, repos[side], commits[side], manifest)))
            shutil.rmtree(work / f"cache-{side}-{n}")
        print(
            f"stream round {n + 1}: local {seconds['local'][-1]:.2f} s, lakeFS {seconds['lakefs'][-1]:.2f} s",
            flush=True,
        )
    best = {side: min(v) for side, v in seconds.items()}
    return {
        "shards": len(manifest.shards),
        "mib": round(total / MiB, 1),
        "mib_per_s": {side: round(total / MiB / v, 1) for side, v in best.items()},
        "lakefs_vs_local": round(best["local"] / best["lakefs"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upload-mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commit-sizes", default="1000,10000,100000")
    parser.add_argument("--code-mb", type=float, default=4.0)
    parser.add_argument("--prose-mb", type=float, default=2.0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.commit_sizes.split(",")]

    work = Path(tempfile.mkdtemp(prefix="tokenlake-lakefs-io-"))
    started_load = os.getloadavg()[0]
    try:
        with LakeFSOnS3(work / "services") as stack:
            server, minio = stack.lakefs, stack.minio
            result = {
                "upload": bench_upload(server, minio, work, args.upload_mib, args.rounds),
                "commit": bench_commits(server, sizes),
                "publish": bench_publish(server, work, args.code_mb, args.prose_mb, min(args.rounds, 2)),
                "stream": bench_stream(server, work, args.rounds),
            }
        result.update(
            load_average={"start": round(started_load, 2), "end": round(os.getloadavg()[0], 2)},
            cpus=os.cpu_count(),
            python=platform.python_version(),
            lakefs="v1.84.0 (embedded KV, MinIO blockstore, loopback)",
        )
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "lakefs_io.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        largest = str(max(sizes))
        print(
            f"lakefs_io: upload_vs_s3={result['upload']['adapter_vs_s3']:.2f} "
            f"commit_{int(largest) // 1000}k_s={result['commit'][largest]['commit_seconds']:.2f} "
            f"publish_vs_local={result['publish']['lakefs_vs_local']:.2f} "
            f"stream_vs_local={result['stream']['lakefs_vs_local']:.2f}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
