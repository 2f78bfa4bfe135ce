"""``tokenlake train``: train a GPT on a dataset commit through the train flow (torchrun inside).

    tokenlake train --dataset v3 --steps 2000 --preset small --nproc 2
    tokenlake train --dataset v3 --nnodes 2 --nproc 8 --rdzv-endpoint node0:29400   # on node 0
    tokenlake train --dataset main --run demo --resume allow-data-change
    tokenlake train --dataset ds-20260101-2 --allow-reverted   # on purpose, recorded in lineage
    tokenlake train --dataset main --set global_batch=32 --set checkpoint.every=100
    tokenlake train --dataset v3 --tensorboard   # then: tensorboard --logdir .tokenlake/runs

``--set`` takes any TrainConfig field (dotted for nested ones); values are JSON when they
parse as JSON, else strings. The repository is the top-level ``--repo``.

Everything that can be checked without Prefect is checked first, in about a second: the
values, the dataset ref (resolved to its commit id) and the training config it makes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from flows.commands.values import whole_number
from flows.defaults import DEFAULT_STEPS
from formats.layout import MAIN


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train", help="train a GPT on a dataset commit (Prefect flow running torchrun)"
    )
    parser.add_argument(
        "--dataset", default=MAIN, metavar="REF", help=f"tag, branch or commit id (default: {MAIN})"
    )
    parser.add_argument(
        "--steps", type=whole_number(1), default=DEFAULT_STEPS,
        help=f"optimizer steps to reach (default: {DEFAULT_STEPS})",
    )  # fmt: skip
    parser.add_argument(
        "--preset", default="tiny", help="model size, a name of training.config.MODEL_PRESETS (default: tiny)"
    )
    parser.add_argument(
        "--nproc",
        type=whole_number(1),
        default=None,
        help="training processes per node (default: $TOKENLAKE_NPROC_PER_NODE or 1)",
    )
    parser.add_argument(
        "--nnodes", type=whole_number(1), default=None,
        help="nodes; past 1 this node hosts the c10d rendezvous and the others run "
        "`python -m training.launch follow` (default: $TOKENLAKE_NNODES or 1)",
    )  # fmt: skip
    parser.add_argument(
        "--rdzv-endpoint", default=None, metavar="HOST:PORT", help="this node's rendezvous address"
    )
    parser.add_argument("--rdzv-id", default=None, help="the job's rendezvous id (default: the flow run id)")
    parser.add_argument(
        "--max-restarts",
        type=whole_number(0),
        default=0,
        help="torchrun restarts of every node's workers (default: 0)",
    )
    parser.add_argument("--run", default=None, help="run name (default: <preset>-<commit prefix>)")
    parser.add_argument(
        "--resume", choices=["auto", "never", "allow-data-change"], default="auto",
        help="auto: continue the run's newest valid checkpoint; never: refuse an existing run; "
        "allow-data-change: continue even on another data commit (recorded)",
    )  # fmt: skip
    parser.add_argument(
        "--allow-reverted", action="store_true",
        help="train on a dataset version that a rollback of main reverted (refused otherwise; recorded in lineage)",
    )  # fmt: skip
    parser.add_argument(
        "--retries", type=whole_number(0), default=2, help="restarts of a crashed torchrun (default: 2)"
    )
    parser.add_argument(
        "--tensorboard", action="store_true",
        help="also write TensorBoard event files beside metrics.jsonl (needs pip install tensorboard; "
        "view with tensorboard --logdir <home>/runs)",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="any TrainConfig field, e.g. global_batch=32 or checkpoint.every=100 (repeatable)",
    )  # fmt: skip
    parser.set_defaults(handler=run_train)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a": {"b": 1}, "c": "x"}``."""
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {pair!r}: expected KEY=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *parents, leaf = key.split(".")
        node = overrides
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return overrides


def run_train(args: argparse.Namespace) -> int:
    from flows.commands.refs import resolve_ref

    overrides = parse_overrides(args.overrides)
    commit = resolve_ref(args.repo, args.dataset, "--dataset")  # a typo fails here, before Prefect starts

    from pydantic import ValidationError

    from flows.commands.values import flag_sentence
    from flows.train import TrainParams, train_flow

    try:
        params = TrainParams(
            dataset=args.dataset, steps=args.steps, preset=args.preset, nproc=args.nproc, nnodes=args.nnodes,
            rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id, max_restarts=args.max_restarts, run=args.run,
            resume=args.resume, allow_reverted=args.allow_reverted, retries=args.retries, repo=args.repo,
            tensorboard=args.tensorboard, overrides=overrides,
        )  # fmt: skip
    except ValidationError as exc:
        raise ValueError(flag_sentence(exc, {"overrides": "--set"})) from None
    check_train_config(params, commit)
    print_training(train_flow(params))
    return 0


def check_train_config(params: Any, commit: str) -> None:
    """The training config these values make, validated before any flow runs (``--set`` values
    named as the flag, in one sentence)."""
    from pydantic import ValidationError

    from flows.commands.values import one_sentence
    from training.errors import TrainingError

    try:
        params.train_config(commit, flow_run_id="")
    except ValidationError as exc:
        raise ValueError(f"--set {one_sentence(exc)}") from None
    except TrainingError as exc:  # --tensorboard without the package
        raise ValueError(str(exc)) from None


def print_training(summary: Any) -> None:
    """What the run did: its metrics when it trained, else that there was nothing to train."""
    from training.metrics import summary_table

    if summary.trained_steps:
        print(summary_table(summary.metrics), end="")
        print(f"trained {summary.run} to step {summary.step} on data commit {summary.data_commit}")
    else:
        print(f"nothing to train: the run {summary.run} is already at step {summary.step} on this commit "
              f"({summary.data_commit[:12]}); --steps N trains it further")  # fmt: skip
    print(f"newest checkpoint: {summary.checkpoint}")
    print(f"checkpoints, metrics.jsonl and loss.png: {summary.run_dir}")
    if any(Path(summary.run_dir).glob("events.out.tfevents.*")):
        print(f"TensorBoard: tensorboard --logdir {summary.run_dir}")
