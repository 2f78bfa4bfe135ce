"""Real sources every machine with Python has, for the demo (``tokenlake run``).

* ``python-stdlib`` (code): the Python standard library's ``.py`` files;
* ``package-docs`` (prose): installed packages' ``METADATA`` (their long descriptions);
* ``licenses`` (prose): installed packages' license files, plus the operating system's
  common licenses where it has them (``/usr/share/common-licenses``). Many packages ship the
  same license text, so this source shows dedup at work.

Each source is a deterministic, size-bounded sample (files spread by a hash of their path),
copied with their modification times into ``<data home>/demo-sources/<source>/`` so that
the demo finishes in a few minutes on two cores, and so that a second run sees unchanged
files and reuses every stage.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import site
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tasks.ingest.config import SourceConfig

MB = 1_000_000
COMMON_LICENSES = Path("/usr/share/common-licenses")


@dataclass(frozen=True)
class DemoBudget:
    code_bytes: int = 3 * MB
    prose_bytes: int = 2 * MB
    license_bytes: int = 1 * MB
    max_file_bytes: int = 200_000  # a demo wants many documents, not a few giant ones


def stdlib_files() -> Iterator[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
        )
        for name in filenames:
            if name.endswith(".py"):
                full = Path(dirpath, name)
                yield full.relative_to(root).as_posix(), full


def site_packages() -> list[Path]:
    seen = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    return [Path(p) for p in dict.fromkeys(seen) if Path(p).is_dir()]


def package_metadata_files() -> Iterator[tuple[str, Path]]:
    for root in site_packages():
        for metadata in sorted(root.glob("*.dist-info/METADATA")):
            yield f"{metadata.parent.name}/METADATA", metadata


def license_files() -> Iterator[tuple[str, Path]]:
    for root in site_packages():
        for dist in sorted(root.glob("*.dist-info")):
            for path in sorted(dist.rglob("*")):
                if path.is_file() and (
                    "licenses" in path.parts or path.name.upper().startswith(("LICENSE", "COPYING"))
                ):
                    yield f"{dist.name}/{path.relative_to(dist).as_posix()}", path
    if COMMON_LICENSES.is_dir():
        for path in sorted(COMMON_LICENSES.iterdir()):
            if path.is_file():
                yield f"common-licenses/{path.name}", path


def sample(files: Iterable[tuple[str, Path]], budget_bytes: int, max_file_bytes: int) -> dict[str, Path]:
    """Files spread over the whole set (ordered by a hash of their name) up to ``budget_bytes``."""
    sized = []
    for rel, path in files:
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if 0 < size <= max_file_bytes:
            sized.append((hashlib.sha256(rel.encode()).hexdigest(), rel, path, size))
    chosen, total = {}, 0
    for _, rel, path, size in sorted(sized):
        if total + size <= budget_bytes:
            chosen[rel] = path
            total += size
    return chosen


def stage(files: dict[str, Path], dest: Path) -> Path:
    """Make ``dest`` hold exactly ``files`` (copies with their mtimes; unchanged files untouched)."""
    dest.mkdir(parents=True, exist_ok=True)
    for existing in sorted(dest.rglob("*"), reverse=True):
        rel = existing.relative_to(dest).as_posix()
        if existing.is_file() and rel not in files:
            existing.unlink()
        elif existing.is_dir() and not any(existing.iterdir()):
            existing.rmdir()
    for rel, src in files.items():
        target = dest / rel
        st = src.stat()
        if target.exists() and (target.stat().st_size, target.stat().st_mtime_ns) == (
            st.st_size,
            st.st_mtime_ns,
        ):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dest


def demo_sources(dest: Path, budget: DemoBudget = DemoBudget()) -> list[SourceConfig]:
    """Stage the demo sources under ``dest`` and return their ingest configs."""
    plan = [
        ("python-stdlib", "code", stdlib_files(), budget.code_bytes),
        ("package-docs", "prose", package_metadata_files(), budget.prose_bytes),
        ("licenses", "prose", license_files(), budget.license_bytes),
    ]
    sources = []
    for name, kind, files, budget_bytes in plan:
        chosen = sample(files, budget_bytes, budget.max_file_bytes)
        if chosen:
            path = stage(chosen, dest / name)
            sources.append(SourceConfig(name=name, kind=kind, format="files", path=str(path)))
    return sources
