"""``tokenlake deploy render-k8s``: the Kubernetes manifests of multi-node training, rendered.

    tokenlake deploy render-k8s --nnodes 4 --gpus-per-node 8 [--namespace ml] [--image REF]

Prints, as one YAML stream:

* the headless Service that gives each training pod a stable name (``<job>-<index>.<service>``),
  the rendezvous address of pod 0, and the shared ReadWriteMany volume claim for run
  directories: both applied once per namespace (``kubectl apply -f``);
* the Indexed Job the Prefect Kubernetes worker creates for one train flow run, from the work
  pool's base job template ``deploy/kubernetes/base-job-template.json`` with these values
  (Prefect's own templating), so it can be read, diffed or checked before a run.

The work pool itself: ``prefect work-pool create tokenlake-k8s --type kubernetes
--base-job-template deploy/kubernetes/base-job-template.json`` (see deploy/kubernetes/README.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

KUBERNETES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
BASE_JOB_TEMPLATE = KUBERNETES_DIR / "base-job-template.json"
CLUSTER_RESOURCES = KUBERNETES_DIR / "cluster-resources.yaml"
FLOW_RUN_COMMAND = "prefect flow-run execute"  # what the worker puts in {{ command }}
# prefect-kubernetes refuses a job manifest without these pod-level fields (its own default
# template has them); they are not PodSpec fields, so the API server drops them (with a
# warning, its default field validation) and they are left out of what is printed here.
PREFECT_ONLY_POD_FIELDS = ("parallelism", "completions")


def register(subparsers: argparse._SubParsersAction) -> None:
    deploy = subparsers.add_parser(
        "deploy", help="deployment helpers: render the Kubernetes training manifests"
    )
    commands = deploy.add_subparsers(dest="deploy_command", metavar="SUBCOMMAND", required=True)
    render = commands.add_parser(
        "render-k8s",
        help="print the Kubernetes manifests of a multi-node training job (work pool template rendered)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    render.add_argument(
        "--nnodes", type=_positive, default=1, help="pods, one torchrun node each (default 1)"
    )
    render.add_argument(
        "--gpus-per-node", type=_positive, default=1, help="GPUs and processes per pod (default 1)"
    )
    render.add_argument("--namespace", default=None, help="default: the template's (default)")
    render.add_argument("--image", default=None, help="tokenlake image; default: the template's")
    render.add_argument("--name", default="tokenlake-train", help="prefix of the job's name")
    render.add_argument("--shared-volume-size", default="1Ti", help="size of the shared volume claim")
    render.add_argument(
        "--set", dest="values", action="append", default=[], metavar="VARIABLE=VALUE",
        help="any other job variable of the template, e.g. restarts_per_node=5 (JSON values parse as JSON)",
    )  # fmt: skip
    render.set_defaults(handler=run_render_k8s)


def run_render_k8s(args: argparse.Namespace) -> int:
    values: dict[str, Any] = {"nnodes": args.nnodes, "gpus_per_node": args.gpus_per_node, "name": args.name}
    for key, value in (("namespace", args.namespace), ("image", args.image)):
        if value is not None:
            values[key] = value
    for pair in args.values:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r}: expected VARIABLE=VALUE")
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
    manifests = render_manifests(values, shared_volume_size=args.shared_volume_size)
    sys.stdout.write(
        "# tokenlake multi-node training: apply the Service and the claim once per namespace;\n"
        "# the Job is what the Prefect Kubernetes worker creates for each train flow run.\n"
    )
    sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False))
    return 0


def load_base_job_template() -> dict[str, Any]:
    return json.loads(BASE_JOB_TEMPLATE.read_text())


def job_variables(template: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The template's variable defaults overridden by ``values``; unknown names are refused."""
    properties = template["variables"]["properties"]
    unknown = sorted(set(values) - set(properties))
    if unknown:
        raise ValueError(
            f"unknown job variable(s) {', '.join(unknown)}; the template has {', '.join(sorted(properties))}"
        )
    defaults = {name: spec["default"] for name, spec in properties.items() if "default" in spec}
    return {**defaults, **values}


def render_job(values: dict[str, Any], template: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Job of one flow run, as the worker renders the base job template (Prefect's templating)."""
    from prefect.utilities.templating import apply_values

    template = template or load_base_job_template()
    variables = job_variables(template, values)
    if variables.get("command") is None:
        variables["command"] = FLOW_RUN_COMMAND
    job = apply_values(copy.deepcopy(template["job_configuration"]["job_manifest"]), variables)
    pod = job["spec"]["template"]["spec"]
    for field in PREFECT_ONLY_POD_FIELDS:
        pod.pop(field, None)
    container = pod["containers"][0]
    if isinstance(container.get("args"), str):  # the worker splits the command the same way
        container["args"] = shlex.split(container["args"])
    return job


def render_cluster_resources(values: dict[str, Any], shared_volume_size: str) -> list[dict[str, Any]]:
    from prefect.utilities.templating import apply_values

    variables = {**job_variables(load_base_job_template(), values), "shared_volume_size": shared_volume_size}
    return [apply_values(doc, variables) for doc in yaml.safe_load_all(CLUSTER_RESOURCES.read_text())]


def render_manifests(values: dict[str, Any], shared_volume_size: str = "1Ti") -> list[dict[str, Any]]:
    return [*render_cluster_resources(values, shared_volume_size), render_job(values)]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value
