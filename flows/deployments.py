"""The deployments of ``deploy/prefect.yaml``, made servable from one process (``tokenlake serve``).

``prefect deploy --all`` reads the same file for work-pool deployments; ``tokenlake serve``
reads each deployment's name, entrypoint, description, tags, parameters and cron schedules
and serves them with :func:`prefect.serve` (no work pool, no worker). A deployment whose
entrypoint cannot be imported yet (``train`` before training exists) is skipped, saying so.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml
from prefect.schedules import Cron
from prefect.types.entrypoint import EntrypointType


def flow_from_entrypoint(entrypoint: str) -> Any:
    """``flows/curate.py:curate`` -> the flow object (imported as a module of the installed project)."""
    path, _, name = entrypoint.partition(":")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    return getattr(module, name)


def load_deployments(prefect_yaml: Path) -> tuple[list[Any], list[tuple[str, str]]]:
    """(RunnerDeployments to serve, [(name, why skipped)])."""
    spec = yaml.safe_load(Path(prefect_yaml).read_text())
    deployments, skipped = [], []
    for entry in spec.get("deployments") or []:
        name = entry["name"]
        try:
            flow = flow_from_entrypoint(entry["entrypoint"])
        except (ImportError, AttributeError) as exc:
            skipped.append((name, f"{entry['entrypoint']} is not importable ({exc})"))
            continue
        schedules = [
            Cron(s["cron"], timezone=s.get("timezone", "UTC"))
            for s in entry.get("schedules") or []
            if "cron" in s and s.get("active", True)
        ]
        deployments.append(
            flow.to_deployment(
                name=name,
                description=entry.get("description"),
                tags=entry.get("tags"),
                parameters=entry.get("parameters") or {},
                schedules=schedules,
                entrypoint_type=EntrypointType.MODULE_PATH,
            )
        )
    return deployments, skipped
