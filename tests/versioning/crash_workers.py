"""Worker processes and the consistency check of the crash and race tests (no tests here).

Kept apart from the test modules so a worker starts without importing pytest: the
crash test starts two dozen of them.
"""

from __future__ import annotations

import io
import json
import os
import random
import sys
import time
from pathlib import Path

from versioning import Conflict, DataRepo, MergeConflict, NoChanges
from versioning.local import LocalRepo, objects


def crash_worker(root: str, seed: int) -> None:
    """Write forever (until killed): prints 'ready' once the repository is open, then the
    number of each operation it completes."""
    # Small chunks, so that kills land between the chunks of multi-chunk writes too.
    objects.CHUNK_BYTES = 64 << 10
    objects.SMALL_BYTES = 16 << 10
    rng = random.Random(seed)
    repo = LocalRepo(root)
    repo.ensure()
    scratch = Path(root).parent / f"scratch-{os.getpid()}"
    scratch.mkdir(exist_ok=True)
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        try:
            _random_operation(repo, rng, scratch, f"{seed}-{step}")
        except (Conflict, NoChanges):
            pass  # a legitimate refusal (e.g. nothing to merge); the loop goes on
        print(step, flush=True)  # progress, so the test knows the kills hit real work


def _random_operation(repo: DataRepo, rng: random.Random, scratch: Path, step: str) -> None:
    branch = rng.choice(["main", "work"])
    if "work" not in repo.list_branches():
        repo.create_branch("work", "main")
    roll = rng.random()
    if roll < 0.5:
        path = f"data/{rng.randrange(40):02}.bin"
        data = rng.randbytes(rng.choice([rng.randrange(1, 20_000), rng.randrange(200_000, 1_500_000)]))
        how = rng.choice(["bytes", "path", "stream"])
        if how == "path":
            source = scratch / f"{step}.bin"
            source.write_bytes(data)
            repo.put(branch, path, source)
        else:
            repo.put(branch, path, data if how == "bytes" else io.BytesIO(data))
    elif roll < 0.7:
        repo.commit(branch, f"step {step}", {"step": step}, allow_empty=True)
    elif roll < 0.85:
        feature = f"feature-{step}"
        repo.create_branch(feature, "main")
        for k in range(rng.randrange(1, 4)):
            repo.put(feature, f"features/{step}/{k}", rng.randbytes(rng.randrange(1, 100_000)))
        repo.commit(feature, f"feature {step}")
        repo.commit("main", f"before merge {step}", allow_empty=True)
        repo.merge(feature, "main", metadata={"step": step})
        repo.delete_branch(feature)
    elif roll < 0.9:
        repo.create_tag(f"t{step}", branch)
    elif roll < 0.95:
        listed = [stat.path for stat in repo.list(branch, "data/")]
        if listed:
            repo.delete(branch, rng.choice(listed))
    else:
        log = list(repo.log("work", limit=3))
        repo.reset_hard("work", log[-1].id)


class ConsistencyCheck:
    """Checks refs, commits and objects through the port. Commits and objects are
    immutable, so each is verified once across calls; refs and staged objects every time."""

    def __init__(self) -> None:
        self.commits: set[str] = set()
        self.objects: dict[str, int] = {}  # checksum -> size

    def __call__(self, repo: DataRepo) -> None:
        for ref, head in [*repo.list_branches().items(), *repo.list_tags().items()]:
            assert repo.resolve(ref) == head
            for commit in repo.log(head):
                if commit.id in self.commits:
                    break  # verified before, and so was everything below it on this line
                assert all(repo.get_commit(parent).id == parent for parent in commit.parents)
                self._check_objects(repo, commit.id)
                if not commit.parents:
                    self.commits.add(commit.id)
                    break
                self.commits.add(commit.id)
            self._check_objects(repo, ref)  # a branch also shows its staged objects

    def _check_objects(self, repo: DataRepo, ref: str) -> None:
        for stat in repo.list(ref):
            if stat.checksum in self.objects:
                assert self.objects[stat.checksum] == stat.size, f"{ref}:{stat.path} size differs"
                continue
            digest = objects.OBJECT_HASHES[repo.object_hash]()
            size = 0
            with repo.open(ref, stat.path) as reader:
                while chunk := reader.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
            assert (digest.hexdigest(), size) == (stat.checksum, stat.size), f"{ref}:{stat.path} is corrupt"
            self.objects[stat.checksum] = size


def race_worker(root: str, mode: str, name: str, go_file: str, count: int) -> None:
    """Say ready, wait for ``go_file``, then race: prints one JSON result line."""
    repo = LocalRepo(root)
    repo.list_branches()  # open the database before the start line
    Path(f"{go_file}.{name}.ready").touch()
    while not os.path.exists(go_file):
        time.sleep(0.001)
    if mode == "commit":
        commits = []
        for i in range(count):
            repo.put(name, f"{name}/{i}", f"{name} {i}".encode())
            repo.put(name, f"{name}/shared-{i}", f"same bytes in every worker {i}".encode())
            commits.append(repo.commit(name, f"{name} {i}").id)
        result: object = commits
    elif mode == "merge":
        merges = []
        for i in range(count):
            feature = f"{name}-{i}"
            repo.create_branch(feature, "main")
            repo.put(feature, f"{name}/{i}", f"{name} {i}".encode())
            repo.commit(feature, f"{feature}")
            merges.append(repo.merge(feature, "main"))
        result = merges
    else:
        try:
            result = {"merged": repo.merge(name, "main")}
        except MergeConflict as exc:
            result = {"conflict": exc.paths}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "crash":
        crash_worker(sys.argv[2], int(sys.argv[3]))
    else:
        race_worker(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
