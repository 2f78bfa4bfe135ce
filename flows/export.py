"""A checkpoint, named ``RUN@STEP``, as a Hugging Face transformers model directory that carries
its lineage: ``tokenlake export``'s work, without Prefect.

The conversion is :mod:`training.export_hf` (no Prefect, no transformers); this module finds the checkpoint
through its lineage record on branch ``runs``, judges it (a checkpoint whose weights saw data
a rollback took off ``main`` is refused unless ``allow_tainted``), gathers what the model card
says (:mod:`flows.model_card`), and writes the directory atomically: into a temporary sibling,
flushed, then renamed, so ``DIR`` is either absent or complete.

The files of a checkpoint are read where its lineage record says it was saved, else under
``<home>/runs/<run>/checkpoints/`` (``home``: the trainer's, ``$TOKENLAKE_HOME`` by default).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flows.lineage import (
    CHECKPOINT_REF,
    CheckpointRecord,
    DataVersion,
    LineageIndex,
    describe_data,
    read_lineage,
)
from flows.model_card import render_card
from flows.wap import documents_per_source
from formats import layout
from formats.mix import MixPlan
from formats.rollbacks import Reverted
from formats.shards import Manifest
from training.checkpoint import COMPLETE, step_dir_name
from training.export_hf import (
    ARCHITECTURE,
    ExportError,
    LoadedCheckpoint,
    TokenizerFacts,
    fsync_tree,
    layer_norm_epsilon,
    load_checkpoint,
    tokenizer_facts,
    write_json,
    write_model_files,
)
from training.runstate import code_version
from training.samples import samples_per_source
from versioning import DataRepo, NotFound, data_home, default_repo_spec, open_repo

LINEAGE_FILE = "tokenlake_lineage.json"
CARD_FILE = "README.md"
LINEAGE_FORMAT = 1
ALLOW_FLAG = "--allow-tainted"


class ExportRefused(ValueError):
    """A tainted checkpoint, exported without ``allow_tainted``: the message says why and how."""


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    checkpoint: str  # RUN@STEP
    files: tuple[str, ...]
    parameters: int
    tainted: bool
    lineage: dict[str, Any]


def export_checkpoint(
    name: str,
    to: str | Path,
    repo_spec: str | None = None,
    home: str | Path | None = None,
    allow_tainted: bool = False,
) -> ExportResult:
    """Export checkpoint ``name`` (``RUN@STEP``) of the repository ``repo_spec`` into the new or
    empty directory ``to``; every problem is a ValueError of one sentence."""
    destination = check_destination(Path(to))
    repo = open_repo(repo_spec, create=False)
    record, index = find_record(repo, name)
    taints = weights_taints(record, index)
    if taints and not allow_tainted:
        raise ExportRefused(
            f"checkpoint {record.name} is tainted: {'; '.join(t.reason for t in taints)}; "
            f"pass {ALLOW_FLAG} to export it anyway (its model card then says so)"
        )
    loaded = load_checkpoint(checkpoint_directory(record, home))
    if loaded.info.step != record.step or loaded.info.meta["data"]["commit"] != record.data_commit:
        raise ExportError(
            f"the checkpoint at {loaded.info.path} is step {loaded.info.step} on data "
            f"{loaded.info.meta['data']['commit'][:12]}, not what the lineage record of {record.name} names"
        )
    data = describe_data(repo, record.data_commit, index)
    manifest, plan, tokenizer = dataset_files(repo, record.data_commit, loaded)
    kept = documents_per_source(repo, record.data_commit)
    lineage = gather_lineage(
        record, index, data, (manifest, plan, kept), loaded, taints, allow_tainted, repo_spec
    )
    files = write_export(destination, loaded, tokenizer, lineage)
    return ExportResult(
        destination, record.name, files, loaded.model.num_params(non_embedding=False), bool(taints), lineage
    )


def check_destination(to: Path) -> Path:
    """``to``, absolute, if an export may be written there: absent, or an empty directory, under
    a directory this process can write."""
    to = Path(os.path.abspath(to.expanduser()))
    if to.exists() or to.is_symlink():
        if not to.is_dir():
            raise ValueError(f"the destination {to} exists and is not a directory; name a new directory")
        if any(to.iterdir()):
            raise ValueError(f"the destination {to} exists and is not empty; name a new or empty directory")
    parent = to.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"the destination {to} cannot be created: {parent} is not a writable directory")
    return to


def find_record(repo: DataRepo, name: str) -> tuple[CheckpointRecord, LineageIndex]:
    """The lineage record of ``RUN@STEP``; an unknown run or step is a ValueError naming what there is."""
    match = CHECKPOINT_REF.match(name)
    if not match:
        raise ValueError(
            f"{name!r} does not name a checkpoint: expected RUN@STEP, e.g. tiny-3f2a9c1b0d4e@300"
        )
    run, step = match["run"], int(match["step"])
    index = read_lineage(repo, run, select=lambda steps: [step])
    if run not in index.listed:
        raise ValueError(
            f"no run named {run!r} has lineage records on branch {layout.LINEAGE_BRANCH!r} of this repository "
            "(`tokenlake lineage TAG` lists the checkpoints trained on a dataset version)"
        )
    found = index.find(run, step)
    if found is None:
        steps = ", ".join(map(str, index.listed[run]))
        raise ValueError(f"run {run!r} has no checkpoint at step {step} (its checkpoints: steps {steps})")
    return found, index


def weights_taints(record: CheckpointRecord, index: LineageIndex) -> list[Reverted]:
    """Every verdict of reverted data on what the checkpoint's weights were trained on: its data
    commit, the commits a resume allowed onto other data came from, and the data of the
    checkpoint a rollback forked it from (:mod:`formats.rollbacks` decides)."""
    commits = [record.data_commit]
    commits += [change["from"]["commit"] for change in record.record.get("data_changes", [])]
    forked = record.record.get("forked_from") or {}
    if forked.get("data_commit"):
        commits.append(forked["data_commit"])
    assert index.history is not None, "read_lineage always reads the rollback history"
    verdicts = index.history.verdicts(dict.fromkeys(commits))
    return [verdicts[c] for c in dict.fromkeys(commits) if verdicts.get(c) is not None]


def checkpoint_directory(record: CheckpointRecord, home: str | Path | None) -> Path:
    """Where the checkpoint's files are on this machine: where it was saved, else under ``home``."""
    runs_home = Path(home).expanduser().resolve() if home is not None else data_home()
    candidates = [
        Path(record.checkpoint),
        runs_home / "runs" / record.run / "checkpoints" / step_dir_name(record.step),
    ]
    for candidate in dict.fromkeys(candidates):
        if (candidate / COMPLETE).is_file():
            return candidate
    looked = " nor ".join(str(c) for c in dict.fromkeys(candidates))
    raise ValueError(
        f"the files of checkpoint {record.name} are not on this machine (no complete checkpoint in {looked}: "
        "pruned by checkpoint.keep_last, or saved on another machine); export where it was trained, "
        "or pass --home with the runs' root that holds it"
    )


def dataset_files(
    repo: DataRepo, commit: str, loaded: LoadedCheckpoint
) -> tuple[Manifest, MixPlan, TokenizerFacts]:
    """The manifest, the mix plan and the tokenizer of the data commit the checkpoint is bound to."""
    try:
        manifest = Manifest.from_json(repo.get(commit, layout.MANIFEST))
        plan = MixPlan.from_json(repo.get(commit, layout.MIX))
    except NotFound as exc:
        raise ExportError(f"data commit {commit[:12]} is not a dataset version ({exc})") from None
    try:
        tokenizer_bytes = repo.get(commit, layout.TOKENIZER)
    except NotFound:
        raise ExportError(
            f"data commit {commit[:12]} has no {layout.TOKENIZER}, so the model would have no tokenizer; "
            "export checkpoints trained on a dataset the shard stage tokenized"
        ) from None
    bound = loaded.info.meta["data"].get("tokenizer_sha256", "")
    if hashlib.sha256(tokenizer_bytes).hexdigest() != bound:
        raise ExportError(
            f"the {layout.TOKENIZER} of data commit {commit[:12]} is not the one checkpoint "
            f"{loaded.info.path.name} was trained with (sha256 {bound[:12] or 'none'})"
        )
    return manifest, plan, tokenizer_facts(tokenizer_bytes.decode(), manifest.eod_token)


def gather_lineage(
    record: CheckpointRecord,
    index: LineageIndex,
    data: DataVersion,
    dataset: tuple[Manifest, MixPlan, dict[str, int]],
    loaded: LoadedCheckpoint,
    taints: list[Reverted],
    allow_tainted: bool,
    repo_spec: str | None,
) -> dict[str, Any]:
    """``tokenlake_lineage.json``: what the model was trained on and how, and whether it is tainted.

    Per source: ``documents``, the dataset version's (the dedup stage's kept count, as `tokenlake
    datasets` shows; None when the version has no dedup report); ``documents_in_shards``, those
    ending in its stored sequences; ``tokens``, stored; ``trained_tokens``, the input tokens of
    the samples this checkpoint's weights were trained on (None after a resume onto other data,
    whose earlier samples followed another mix plan)."""
    manifest, plan, kept = dataset
    meta, config = loaded.info.meta, loaded.info.meta["config"]
    in_shards: dict[str, int] = {}
    for shard in manifest.shards:
        in_shards[shard.source] = in_shards.get(shard.source, 0) + shard.documents
    trained, loader = None, meta.get("loader")
    if loader is not None and not meta.get("data_changes"):
        heldout = float(config.get("data", {}).get("heldout_fraction", 0.01))
        skipped = [(int(a), int(b)) for a, b in loader["skipped"]]
        trained = samples_per_source(plan, heldout, int(loader["cursor"]), skipped) * plan.seq_len
    sources = [
        {
            "name": source,
            "documents": kept.get(source),
            "documents_in_shards": in_shards.get(source, 0),
            "sequences": plan.source_sequences[i],
            "tokens": plan.source_tokens[i],
            "trained_tokens": None if trained is None else int(trained[i]),
            "weights": [round(phase.weights[i], 6) for phase in plan.phases],
            "token_budget": plan.token_budgets[i],
            "epochs": round(plan.epochs[i], 4),
        }
        for i, source in enumerate(plan.source_names)
    ]
    events = [e for e in index.events if e["run"] == record.run and e["step"] <= record.step]
    return {
        "format": LINEAGE_FORMAT,
        "checkpoint": {
            "name": record.name, "run": record.run, "step": record.step, "path": str(loaded.info.path),
            "flow_run_id": record.flow_run_id, "code_version": meta.get("code_version", ""),
            "saved_at": record.saved_at, "forked_from": record.record.get("forked_from"),
        },
        "dataset": {
            "repository": repo_spec or default_repo_spec(), "data_commit": record.data_commit,
            "tags": list(data.tags), "publish_tag": data.publish_tag, "publish_commit": data.publish_commit,
            "publish_flow_run_id": data.publish_flow_run_id, "kind": data.kind, "message": data.message,
            "manifest_sha256": meta["data"].get("manifest_sha256", ""), "mix_sha256": meta["data"].get("mix_sha256", ""),
            "tokenizer_sha256": meta["data"].get("tokenizer_sha256", ""),
        },
        "stages": [asdict(stage) for stage in data.stages],
        "sources": sources,
        "source_configs": list(data.sources),
        "mixture": {
            "spec": plan.spec, "seed": plan.seed, "seq_len": plan.seq_len, "total_samples": plan.total_samples,
            "total_tokens": plan.total_tokens,
            "phases": [{"start_sample": p.start, "stop_sample": p.stop,
                        "weights": dict(zip(plan.source_names, p.weights, strict=True))} for p in plan.phases],
        },
        "training": {
            "steps": record.step, "tokens": record.tokens, "global_batch": config["global_batch"],
            "seq_len": loaded.model.config.block_size, "world_size": meta.get("world_size"),
            "parallel": config.get("parallel"), "dtype": config.get("dtype"), "seed": config.get("seed"),
            "model": config["model"], "optim": config.get("optim"),
            "stability_rollbacks": meta.get("rollbacks", []), "data_changes": meta.get("data_changes", []),
        },
        "metrics": record.metrics,
        "taint": {
            "tainted": bool(taints), "reasons": [t.to_dict() for t in taints],
            "exported_with": ALLOW_FLAG if taints and allow_tainted else None,
            "marks": [asdict(mark) for mark in record.taints],
        },
        "events": events,
        "export": {
            "architecture": ARCHITECTURE, "parameters": loaded.model.num_params(non_embedding=False),
            "vocab_size": loaded.model.config.vocab_size, "tokenizer_vocab_size": manifest.vocab_size,
            "n_positions": loaded.model.config.block_size, "trained_with_biases": loaded.model.config.bias,
            "layer_norm_epsilon": layer_norm_epsilon(loaded.model), "dtype": "float32",
            "exported_at": time.time(), "exported_by": code_version(),
        },
    }  # fmt: skip


def write_export(
    destination: Path, loaded: LoadedCheckpoint, tokenizer: TokenizerFacts, lineage: dict[str, Any]
) -> tuple[str, ...]:
    """Every file into a temporary sibling of ``destination``, flushed, then renamed into place;
    whatever goes wrong, the temporary directory goes: no half-written export is left."""
    tmp = destination.parent / f".tmp-{destination.name}-{os.getpid()}"
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files = write_model_files(tmp, loaded.model, tokenizer)
        write_json(tmp / LINEAGE_FILE, lineage)
        (tmp / CARD_FILE).write_text(render_card(lineage, tokenizer))
        fsync_tree(tmp)
        if destination.is_dir():  # empty (checked first): replaced by the complete export
            destination.rmdir()
        os.rename(tmp, destination)
    except OSError as exc:
        raise ValueError(f"cannot write the export to {destination}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; else what was half-written
    return (*files, LINEAGE_FILE, CARD_FILE)
