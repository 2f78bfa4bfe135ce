"""Build the pinned services (``deploy/services.toml``) from their Go modules into the cache.

``python -m flows.services.build [--check] [NAME ...]`` (``./dev services``) fetches each module at
its pinned version through the Go module proxy (``go mod download -json``), copies it out of the
read-only module cache into a scratch directory and runs ``go build`` there. ``go install
module@version`` would be shorter, but it refuses a module whose ``go.mod`` has a ``replace``
directive, and lakeFS's has one.

The binaries land in ``<cache>/<name>-<version>/bin/``, built into a temporary directory and
renamed into place, so a killed build never leaves a half-written service behind, and a file lock
lets two builds of the same cache (two CI jobs, ``./dev test`` in two shells) wait for each other
instead of racing.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PINS_FILE = Path(__file__).resolve().parents[2] / "deploy" / "services.toml"
CACHE_ENV = "TOKENLAKE_SERVICES_CACHE"


class ServiceUnavailable(RuntimeError):
    """A pinned service is not built, or cannot be built here; the message says what to do."""


@dataclass(frozen=True)
class ServicePin:
    name: str
    module: str
    version: str
    binaries: dict[str, str]  # executable -> package inside the module
    ldflags: str = ""

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


def load_pins(path: Path = PINS_FILE) -> dict[str, ServicePin]:
    with path.open("rb") as f:
        table = tomllib.load(f)
    return {
        name: ServicePin(
            name=name,
            module=entry["module"],
            version=entry["version"],
            binaries=dict(entry["binaries"]),
            ldflags=entry.get("ldflags", ""),
        )
        for name, entry in table.items()
    }


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tokenlake" / "services"


def install_dir(pin: ServicePin) -> Path:
    return cache_root() / f"{pin.name}-{pin.version}"


def is_built(pin: ServicePin) -> bool:
    return all((install_dir(pin) / "bin" / exe).is_file() for exe in pin.binaries)


def binary(service: str, executable: str | None = None) -> Path:
    """The path of a built service's executable (by default the one named like the service)."""
    pin = load_pins()[service]
    exe = executable or service
    if exe not in pin.binaries:
        raise KeyError(f"{service} has no executable {exe!r}; it builds {sorted(pin.binaries)}")
    path = install_dir(pin) / "bin" / exe
    if not path.is_file():
        raise ServiceUnavailable(f"{pin.label} is not built in {cache_root()}: run `./dev services`")
    return path


def _go_environment() -> dict[str, str]:
    if shutil.which("go") is None:
        raise ServiceUnavailable(
            "building the test services needs Go (1.26) on PATH; install it or point "
            f"{CACHE_ENV} at a cache that has them built"
        )
    # The machine's own Go: a toolchain line in a module's go.mod must not send it downloading.
    return os.environ | {"GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false", "CGO_ENABLED": "0"}


def _download(pin: ServicePin, env: dict[str, str], scratch: Path) -> Path:
    """The module's directory in the Go module cache (read-only), fetched through the proxy."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{pin.module}@{pin.version}"],
        cwd=scratch,  # outside any module, so no go.mod of ours is consulted or changed
        env=env,
        capture_output=True,
        text=True,
    )
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = {"Error": (result.stderr or result.stdout).strip()}
    if result.returncode != 0 or info.get("Error") or not info.get("Dir"):
        raise ServiceUnavailable(
            f"the Go module proxy did not give {pin.module}@{pin.version}: {info.get('Error') or result.stderr.strip()}"
        )
    return Path(info["Dir"])


def _writable_copy(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True)
    for root, dirs, files in os.walk(target):
        for name in dirs + files:
            path = Path(root) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
    target.chmod(target.stat().st_mode | stat.S_IWUSR)


@contextmanager
def _cache_lock() -> Iterator[None]:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(pin: ServicePin, say: Callable[[str], None] = print) -> Path:
    """Build ``pin`` into its install directory unless it is there already; returns that directory."""
    with _cache_lock():
        target = install_dir(pin)
        if is_built(pin):
            return target
        env = _go_environment()
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"build-{pin.name}-", dir=cache_root()) as tmp:
            scratch = Path(tmp)
            say(f"services: fetching {pin.module}@{pin.version} from the Go module proxy ...")
            source = scratch / "src"
            _writable_copy(_download(pin, env, scratch), source)
            staged = scratch / "install"
            (staged / "bin").mkdir(parents=True)
            for exe, package in pin.binaries.items():
                say(f"services: building {exe} ({pin.label}) ...")
                command = ["go", "build", "-trimpath", "-o", str(staged / "bin" / exe)]
                if pin.ldflags:
                    command += ["-ldflags", pin.ldflags]
                result = subprocess.run(
                    [*command, package], cwd=source, env=env, capture_output=True, text=True
                )
                if result.returncode != 0:
                    raise ServiceUnavailable(
                        f"go build of {exe} ({pin.label}) failed:\n{result.stderr.strip()[-4000:]}"
                    )
            (staged / "pin.json").write_text(
                json.dumps({"module": pin.module, "version": pin.version, "binaries": pin.binaries})
            )
            if target.exists():  # a partial install of an older layout
                shutil.rmtree(target)
            staged.rename(target)
        say(f"services: {pin.label} built in {time.monotonic() - started:.0f} s into {target}")
        return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="./dev services", description="Build the pinned test services into the cache."
    )
    parser.add_argument("names", nargs="*", help="services to build (default: all of deploy/services.toml)")
    parser.add_argument("--check", action="store_true", help="build nothing; exit 1 if any is missing")
    args = parser.parse_args(argv)
    pins = load_pins()
    unknown = sorted(set(args.names) - set(pins))
    if unknown:
        parser.error(f"unknown service {unknown[0]!r}; deploy/services.toml pins {sorted(pins)}")
    chosen = [pins[name] for name in args.names or pins]
    if args.check:
        missing = [pin.label for pin in chosen if not is_built(pin)]
        for label in missing:
            print(f"services: {label} is not built", file=sys.stderr)
        return 1 if missing else 0
    try:
        for pin in chosen:
            build(pin, say=lambda line: print(line, file=sys.stderr, flush=True))
    except ServiceUnavailable as exc:
        print(f"services: {exc}", file=sys.stderr)
        return 1
    print(cache_root())
    return 0


if __name__ == "__main__":
    sys.exit(main())
