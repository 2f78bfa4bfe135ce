"""Object IO through the local adapter against plain file copies, and lakeFS (API double) against local.

Measured in one run, rounds interleaved (best of each, the machines are shared):

* large objects (default 1 GiB as 16 x 64 MiB): write = ``put`` from a file path of
  every object plus the commit, against ``shutil.copyfile`` of the same files into a
  plain directory; read = every byte through a 1 MiB ``readinto`` buffer, from
  ``repo.open`` against ``open`` on the plain copies. The local adapter hashes while it
  copies and makes the committed objects durable at the commit (one ``syncfs``); the
  plain copy does not fsync, so ``plain copy + fsync`` is shown too, and ``local,
  durable=False`` (no fsync; still safe against a killed process) shows the cost of
  hashing alone. ``local, sha256`` is the same store naming objects by SHA-256 (format-1
  repositories) instead of BLAKE3: the figures behind the hash choice;
* small objects (default 10,000 x 4 KiB): the same, per object, read with ``get``;
* the lakeFS adapter (``LakeFSRepo``, the official SDK over HTTP) against the lakeFS API
  double from ``tests/lakefs_double`` (request validation off, backed by a local repo
  without fsync) versus the local adapter without fsync, at the same sizes (smaller by
  default: HTTP per object).

The load average is recorded at the start and the end: on a shared machine, sha256
(which the plain copy does not compute) competes for the CPU with everyone else.

    .venv/bin/python benchmarks/repo_io.py [--large-mib 1024] [--small-count 10000] [--rounds 2]

Results go to benchmarks/results/repo_io.json. Last line:
``repo_io: local/plain write=<x> read=<y>`` (large objects, time of local over plain).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from versioning import DataRepo  # noqa: E402
from versioning.local import LocalRepo  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
LARGE_OBJECTS = 16
READ_BUFFER = 1 << 20


@dataclass
class Row:
    case: str
    method: str
    objects: int
    bytes: int
    seconds: float
    baseline: str
    ratio: float | None = None  # seconds over the baseline's seconds


def best_of(rounds: int, methods: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Run every method once per round in a shuffled order; keep each one's best time."""
    best = {name: float("inf") for name in methods}
    order = list(methods)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            best[name] = min(best[name], methods[name]())
    return best


def timed(
    prepare: Callable[[], object], work: Callable[[object], None], cleanup: Callable[[object], None]
) -> float:
    state = prepare()
    start = time.perf_counter()
    work(state)
    seconds = time.perf_counter() - start
    cleanup(state)
    return seconds


def make_sources(directory: Path, count: int, size: int) -> list[Path]:
    directory.mkdir(parents=True)
    paths = []
    for i in range(count):
        path = directory / f"{i:05}.bin"
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


def object_path(i: int, count: int) -> str:
    return f"objects/{i // 100:03}/{i:05}.bin" if count > 100 else f"objects/{i:05}.bin"


def plain_writer(sources: list[Path], base: Path, fsync: bool) -> Callable[[], float]:
    def prepare() -> Path:
        target = Path(tempfile.mkdtemp(dir=base, prefix="plain-"))
        for i in range(len(sources)):
            (target / object_path(i, len(sources))).parent.mkdir(parents=True, exist_ok=True)
        return target

    def work(target: Path) -> None:
        for i, source in enumerate(sources):
            destination = target / object_path(i, len(sources))
            shutil.copyfile(source, destination)
            if fsync:
                fd = os.open(destination, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)

    return lambda: timed(prepare, work, lambda target: shutil.rmtree(target))


def repo_writer(sources: list[Path], open_repo: Callable[[], DataRepo], close: Callable[[DataRepo], None]):
    def work(repo: DataRepo) -> None:
        for i, source in enumerate(sources):
            repo.put("main", object_path(i, len(sources)), source)
        repo.commit("main", f"{len(sources)} objects")

    return lambda: timed(open_repo, work, close)


def read_all(reader) -> int:
    buffer = memoryview(bytearray(READ_BUFFER))
    total = 0
    while n := reader.readinto(buffer):
        total += n
    return total


def local_repo_factory(
    base: Path, durable: bool = True, object_hash: str | None = None
) -> tuple[Callable[[], DataRepo], Callable]:
    def create() -> DataRepo:
        root = Path(tempfile.mkdtemp(dir=base, prefix="local-")) / "repo"
        repo = LocalRepo(root, durable=durable, object_hash=object_hash)
        repo.ensure()
        return repo

    def remove(repo: LocalRepo) -> None:
        repo.close()
        shutil.rmtree(repo.root.parent)

    return create, remove


def measure_local_vs_plain(work: Path, sources: list[Path], rounds: int, case: str, label: str) -> list[Row]:
    count, size = len(sources), sum(p.stat().st_size for p in sources)
    local, remove = local_repo_factory(work)
    fast_local, fast_remove = local_repo_factory(work, durable=False)
    sha256_local, sha256_remove = local_repo_factory(work, object_hash="sha256")
    fast_sha256_local, fast_sha256_remove = local_repo_factory(work, durable=False, object_hash="sha256")
    writes = best_of(
        rounds,
        {
            "plain copy": plain_writer(sources, work, fsync=False),
            "plain copy + fsync": plain_writer(sources, work, fsync=True),
            "local": repo_writer(sources, local, remove),
            "local, durable=False": repo_writer(sources, fast_local, fast_remove),
            "local, sha256": repo_writer(sources, sha256_local, sha256_remove),
            "local, sha256, durable=False": repo_writer(sources, fast_sha256_local, fast_sha256_remove),
        },
    )
    # One plain copy and one repository, kept for the reads.
    plain_dir = Path(tempfile.mkdtemp(dir=work, prefix="plain-read-"))
    for i, source in enumerate(sources):
        (plain_dir / object_path(i, count)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, plain_dir / object_path(i, count))
    repo = local()
    for i, source in enumerate(sources):
        repo.put("main", object_path(i, count), source)
    repo.commit("main", "read set")

    def read_plain() -> float:
        start = time.perf_counter()
        for i in range(count):
            with open(plain_dir / object_path(i, count), "rb", buffering=0) as reader:
                assert read_all(reader) == sources[i].stat().st_size
        return time.perf_counter() - start

    def read_local() -> float:
        start = time.perf_counter()
        for i in range(count):
            with repo.open("main", object_path(i, count)) as reader:
                assert read_all(reader) == sources[i].stat().st_size
        return time.perf_counter() - start

    reads = best_of(rounds, {"plain open": read_plain, "local open": read_local})
    remove(repo)
    shutil.rmtree(plain_dir)
    rows = [
        Row(f"{case} write", method, count, size, seconds, "plain copy", seconds / writes["plain copy"])
        for method, seconds in writes.items()
    ]
    rows += [
        Row(f"{case} read", method, count, size, seconds, "plain open", seconds / reads["plain open"])
        for method, seconds in reads.items()
    ]
    print(f"  measured {label}", flush=True)
    return rows


def measure_lakefs_vs_local(work: Path, sources: list[Path], rounds: int, case: str) -> list[Row]:
    from tests.lakefs_double import LakeFSDouble
    from versioning.lakefs import LakeFSRepo

    count, size = len(sources), sum(p.stat().st_size for p in sources)
    # The double stores into a LocalRepo without fsync; compare with the same, so the
    # ratio is the cost of the SDK and HTTP alone.
    local, remove = local_repo_factory(work, durable=False)
    with LakeFSDouble(work / "lakefs-double", validate=False) as double:
        names = iter(range(10**6))

        def lakefs_repo() -> DataRepo:
            repo = LakeFSRepo.connect(
                double.endpoint, double.access_key_id, double.secret_access_key, f"bench-{next(names)}"
            )
            repo.ensure()
            return repo

        writes = best_of(
            rounds,
            {
                "local": repo_writer(sources, local, remove),
                "lakefs (double)": repo_writer(sources, lakefs_repo, _keep),
            },
        )
        repos = {"local": local(), "lakefs (double)": lakefs_repo()}
        for repo in repos.values():
            for i, source in enumerate(sources):
                repo.put("main", object_path(i, count), source)
            repo.commit("main", "read set")

        def reader(repo: DataRepo) -> Callable[[], float]:
            def read() -> float:
                start = time.perf_counter()
                for i in range(count):
                    assert len(repo.get("main", object_path(i, count))) == sources[i].stat().st_size
                return time.perf_counter() - start

            return read

        reads = best_of(rounds, {name: reader(repo) for name, repo in repos.items()})
        remove(repos["local"])
    rows = [
        Row(f"{case} write", method, count, size, seconds, "local", seconds / writes["local"])
        for method, seconds in writes.items()
    ]
    rows += [
        Row(f"{case} read", method, count, size, seconds, "local", seconds / reads["local"])
        for method, seconds in reads.items()
    ]
    print(f"  measured lakeFS {case}", flush=True)
    return rows


def _keep(repo: DataRepo) -> None:
    """lakeFS repositories of the double live until the double stops."""


def _load(averages: tuple[float, float, float]) -> str:
    return "/".join(f"{value:.1f}" for value in averages)


def print_table(rows: list[Row]) -> None:
    header = f"{'case':<22} {'method':<22} {'objects':>8} {'MiB':>8} {'seconds':>8} {'MiB/s':>8} {'obj/s':>9}  ratio"
    print(header)
    print("-" * len(header))
    for row in rows:
        mib = row.bytes / (1 << 20)
        ratio = f"{row.ratio:.2f}x {row.baseline}" if row.ratio is not None else ""
        print(
            f"{row.case:<22} {row.method:<22} {row.objects:>8} {mib:>8.1f} {row.seconds:>8.3f} "
            f"{mib / row.seconds:>8.1f} {row.objects / row.seconds:>9.0f}  {ratio}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large-mib", type=int, default=1024, help="total MiB of large objects (16 objects)")
    parser.add_argument("--small-count", type=int, default=10_000, help="number of small objects")
    parser.add_argument("--small-kib", type=int, default=4, help="size of each small object")
    parser.add_argument(
        "--lakefs-large-mib", type=int, default=None, help="default: a quarter of --large-mib"
    )
    parser.add_argument(
        "--lakefs-small-count", type=int, default=None, help="default: a tenth of --small-count"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--output", type=Path, default=RESULTS / "repo_io.json")
    args = parser.parse_args(argv)
    if args.large_mib < LARGE_OBJECTS or args.small_count < 1 or args.rounds < 1:
        parser.error(f"--large-mib must be at least {LARGE_OBJECTS}, --small-count and --rounds at least 1")
    lakefs_large_mib = args.lakefs_large_mib or max(LARGE_OBJECTS, args.large_mib // 4)
    lakefs_small_count = args.lakefs_small_count or max(1, args.small_count // 10)

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="repo-io-", dir=args.workdir))
    try:
        print(f"repo_io: sources under {work}", flush=True)
        large = make_sources(work / "src-large", LARGE_OBJECTS, (args.large_mib << 20) // LARGE_OBJECTS)
        small = make_sources(work / "src-small", args.small_count, args.small_kib << 10)
        rows = measure_local_vs_plain(work, large, args.rounds, "large", f"{args.large_mib} MiB large")
        rows += measure_local_vs_plain(work, small, args.rounds, "small", f"{args.small_count} small")
        lakefs_note = None
        try:
            import tests.lakefs_double  # noqa: F401
            import versioning.lakefs  # noqa: F401
        except ImportError as exc:
            lakefs_note = f"lakeFS comparison skipped: {exc}"
            print(lakefs_note)
        if lakefs_note is None:
            lakefs_large = large[: max(1, LARGE_OBJECTS * lakefs_large_mib // args.large_mib)]
            rows += measure_lakefs_vs_local(work, lakefs_large, args.rounds, "lakefs large")
            rows += measure_lakefs_vs_local(work, small[:lakefs_small_count], args.rounds, "lakefs small")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    load_after = os.getloadavg()
    print()
    print(
        f"load average (1/5/15 min): start {_load(load_before)}, end {_load(load_after)}, on {os.cpu_count()} cpus"
    )
    print_table(rows)
    ratio = {(r.case, r.method): r.ratio for r in rows}
    write, read = ratio[("large write", "local")], ratio[("large read", "local open")]
    summary = {
        "local_over_plain_write": write,
        "local_over_plain_read": read,
        "local_over_plain_fsync_write": ratio[("large write", "local")]
        / ratio[("large write", "plain copy + fsync")],
        "small_local_over_plain_write": ratio[("small write", "local")],
        "small_local_over_plain_read": ratio[("small read", "local open")],
        # the hash decision: the same store naming objects by SHA-256 (format 1) instead of BLAKE3
        "sha256_local_over_plain_write": ratio[("large write", "local, sha256")],
        "sha256_over_blake3_write": ratio[("large write", "local, sha256")] / write,
        "sha256_over_blake3_write_durable_false": ratio[("large write", "local, sha256, durable=False")]
        / ratio[("large write", "local, durable=False")],
    }
    if ("lakefs large write", "lakefs (double)") in ratio:
        summary |= {
            f"lakefs_over_local_{size}_{op}": ratio[(f"lakefs {size} {op}", "lakefs (double)")]
            for size in ("large", "small")
            for op in ("write", "read")
        }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "benchmark": "repo_io",
                "parameters": {
                    "large_mib": args.large_mib,
                    "large_objects": LARGE_OBJECTS,
                    "small_count": args.small_count,
                    "small_kib": args.small_kib,
                    "lakefs_large_mib": lakefs_large_mib,
                    "lakefs_small_count": lakefs_small_count,
                    "rounds": args.rounds,
                },
                "machine": {
                    "platform": platform.platform(),
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "load_average_start": load_before,
                    "load_average_end": load_after,
                },
                "lakefs_note": lakefs_note,
                "summary": summary,
                "rows": [asdict(row) for row in rows],
            },
            indent=2,
        )
        + "\n"
    )
    print()
    print(
        f"local/plain+fsync write={summary['local_over_plain_fsync_write']:.2f}; "
        f"small objects local/plain write={summary['small_local_over_plain_write']:.2f} "
        f"read={summary['small_local_over_plain_read']:.2f}"
    )
    if "lakefs_over_local_large_write" in summary:
        print(
            "lakefs(double)/local "
            + " ".join(
                f"{key.removeprefix('lakefs_over_local_')}={value:.2f}"
                for key, value in summary.items()
                if key.startswith("lakefs")
            )
        )
    print(f"repo_io: local/plain write={write:.2f} read={read:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
