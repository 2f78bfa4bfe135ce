"""``python -m training`` (or ``torchrun ... -m training``): run the trainer from a config.

Either ``--config run.json`` (a TrainConfig as JSON; what the train flow writes) or the
common fields as flags. Flags given next to ``--config`` override it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from training.config import MODEL_PRESETS, ModelConfig, TrainConfig


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    parser.add_argument("--config", type=Path, help="TrainConfig JSON file")
    parser.add_argument("--run", help="run name")
    parser.add_argument("--commit", help="data commit id (or a ref, resolved once)")
    parser.add_argument("--repo", help="dataset repository spec")
    parser.add_argument("--home", help="runs and cache root")
    parser.add_argument("--preset", choices=sorted(MODEL_PRESETS), help="model size")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--global-batch", type=int)
    parser.add_argument("--micro-batch", type=int)
    parser.add_argument("--resume", choices=["auto", "never", "allow-data-change"])
    parser.add_argument(
        "--allow-reverted",
        action="store_true",
        help="train on data a rollback reverted (recorded in lineage)",
    )
    parser.add_argument("--flow-run-id")
    parser.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard event files (pip install tensorboard)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="plain log lines instead of a progress bar"
    )
    args = parser.parse_args(argv)

    fields = json.loads(args.config.read_text()) if args.config else {}
    flags = {
        "run": args.run,
        "commit": args.commit,
        "repo": args.repo,
        "home": args.home,
        "steps": args.steps,
        "global_batch": args.global_batch,
        "micro_batch": args.micro_batch,
        "resume": args.resume,
        "flow_run_id": args.flow_run_id,
    }
    fields.update({k: v for k, v in flags.items() if v is not None})
    if args.preset:
        fields["model"] = ModelConfig.preset(args.preset).model_dump()
    if args.no_progress:
        fields["progress"] = False
    if args.allow_reverted:
        fields["allow_reverted"] = True
    if args.tensorboard:
        fields["tensorboard"] = True
    return TrainConfig.model_validate(fields)


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    from training.errors import REFUSED_EXIT, TrainingError
    from training.trainer import train

    try:
        train(config)
    except TrainingError as exc:  # a clear sentence, not a traceback from every rank
        print(f"training: error: {exc}", file=sys.stderr, flush=True)
        return REFUSED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
