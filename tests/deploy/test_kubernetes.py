"""The Kubernetes work pool of multi-node training: the base job template rendered for several
sizes, by our renderer and by the Prefect Kubernetes worker's own job configuration, and every
manifest validated against the Kubernetes API schemas (kubernetes-validate, offline)."""

from __future__ import annotations

import asyncio
import copy
import re
import uuid

import kubernetes_validate
import pytest
import yaml

from flows.commands.deploy import PREFECT_ONLY_POD_FIELDS, load_base_job_template, render_manifests
from flows.train import TrainParams

KUBERNETES_VERSION = "1.33.0"  # Indexed Jobs with backoffLimitPerIndex (GA in 1.33) and podFailurePolicy
SIZES = [(1, 1), (2, 8), (4, 8), (16, 8)]


def validate(manifest: dict) -> None:
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def trainer(job: dict) -> dict:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize(("nnodes", "gpus"), SIZES)
def test_rendered_manifests_validate_and_describe_the_job(nnodes, gpus):
    service, claim, job = render_manifests({"nnodes": nnodes, "gpus_per_node": gpus, "namespace": "ml"})
    for manifest in (service, claim, job):
        validate(manifest)
    assert [m["kind"] for m in (service, claim, job)] == ["Service", "PersistentVolumeClaim", "Job"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == nnodes
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    container = trainer(job)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert f"--nnodes={nnodes}" in container["command"] and f"--nproc-per-node={gpus}" in container["command"]
    assert container["args"] == ["prefect", "flow-run", "execute"]
    (volume,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    secrets = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert set(secrets) == {
        "LAKECTL_SERVER_ENDPOINT_URL", "LAKECTL_CREDENTIALS_ACCESS_KEY_ID", "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"
    }  # fmt: skip
    assert all("value" not in e for e in container["env"] if e["name"].startswith("LAKECTL_CREDENTIALS"))


def test_the_validator_rejects_a_broken_manifest():
    """The check bites: a count as a string, and a field the API does not have."""
    *_, job = render_manifests({"nnodes": 2, "gpus_per_node": 8})
    broken = yaml.safe_load(yaml.safe_dump(job))
    broken["spec"]["completions"] = "2"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)
    unknown = yaml.safe_load(yaml.safe_dump(job))
    unknown["spec"]["template"]["spec"]["completions"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(unknown)


def test_every_placeholder_of_the_template_is_a_declared_variable():
    template = load_base_job_template()
    used = set(re.findall(r"{{\s*([\w.]+)\s*}}", yaml.safe_dump(template["job_configuration"])))
    declared = set(template["variables"]["properties"])
    assert used <= declared and {"nnodes", "gpus_per_node", "command", "env"} <= used


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize(("nnodes", "gpus"), SIZES)
def test_the_prefect_kubernetes_worker_builds_a_valid_job_from_the_template(nnodes, gpus):
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    template = load_base_job_template()
    values = {"nnodes": nnodes, "gpus_per_node": gpus, "env": {"EXTRA": "1"}}
    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(template, values))
    flow_run = FlowRun(id=uuid.uuid4(), flow_id=uuid.uuid4(), name="steady-otter")
    config.prepare_for_flow_run(flow_run)
    job = copy.deepcopy(config.job_manifest)
    pod = job["spec"]["template"]["spec"]
    # the two pod-level fields prefect-kubernetes insists on: the API server drops them, and
    # nothing else in the worker's job may be unknown to it
    assert {field: pod.pop(field) for field in PREFECT_ONLY_POD_FIELDS} == {
        "parallelism": 1,
        "completions": 1,
    }
    validate(job)
    env = {e["name"]: e for e in trainer(job)["env"]}
    assert env["PREFECT__FLOW_RUN_ID"]["value"] == str(flow_run.id) and env["EXTRA"]["value"] == "1"
    assert (
        env["LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"]
        == "tokenlake-lakefs"
    )
    assert trainer(job)["args"] == [
        "prefect",
        "flow-run",
        "execute",
    ]  # pod 0 runs it; training.launch decides
    assert job["spec"]["completions"] == nnodes and job["metadata"]["generateName"].endswith("-")


def test_a_pod_s_shape_reaches_the_train_flow_and_a_contradiction_fails_fast(monkeypatch):
    """What `python -m training.launch pod` exports is what the flow launches torchrun with."""
    shape = {
        "TOKENLAKE_NNODES": "4", "TOKENLAKE_NPROC_PER_NODE": "8",
        "TOKENLAKE_RDZV_ENDPOINT": "tokenlake-train-x7k2p-0.tokenlake-train:29400",
        "TOKENLAKE_RDZV_ID": "tokenlake-train-x7k2p",
    }  # fmt: skip
    for name, value in shape.items():
        monkeypatch.setenv(name, value)
    launch = TrainParams().launch_config("flow-run-id")
    assert (launch.nnodes, launch.nproc_per_node, launch.world_size) == (4, 8, 32)
    assert launch.rdzv_id == "tokenlake-train-x7k2p" and launch.rdzv_is_host is True
    args = launch.torchrun_args()
    assert "--rdzv-backend=c10d" in args and "--standalone" not in args
    assert "--rdzv-endpoint=tokenlake-train-x7k2p-0.tokenlake-train:29400" in args
    with pytest.raises(ValueError, match="nnodes=2 contradicts \\$TOKENLAKE_NNODES=4"):
        TrainParams(nnodes=2).launch_config("flow-run-id")


def test_one_node_with_a_rendezvous_endpoint_still_hosts_it(monkeypatch):
    """A one-pod job (nnodes=1) keeps the c10d rendezvous of the template: its only node hosts it."""
    monkeypatch.setenv("TOKENLAKE_NNODES", "1")
    monkeypatch.setenv("TOKENLAKE_RDZV_ENDPOINT", "tokenlake-train-ab12c-0.tokenlake-train:29400")
    launch = TrainParams().launch_config("flow-run-id")
    assert not launch.standalone and launch.rdzv_is_host is True and launch.rdzv_id == "flow-run-id"
    assert "--rdzv-conf=is_host=true" in launch.torchrun_args()
    monkeypatch.delenv("TOKENLAKE_NNODES")
    monkeypatch.delenv("TOKENLAKE_RDZV_ENDPOINT")
    assert TrainParams().launch_config("flow-run-id").torchrun_args()[0] == "--standalone"
