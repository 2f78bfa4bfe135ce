"""``tokenlake export RUN@STEP --to DIR``: a checkpoint as a Hugging Face transformers model
directory, its lineage in the model card.

    tokenlake export tiny-3f2a9c1b0d4e@300 --to models/tiny-300
    tokenlake export tiny-3f2a9c1b0d4e@300 --to models/tiny-300 --allow-tainted   # stated in the card

An unknown run or step, a destination that exists and is not empty or cannot be written, and a
tainted checkpoint without ``--allow-tainted`` each end the command with one sentence and exit 2.
"""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="a checkpoint as a Hugging Face transformers model directory, its lineage in the model card",
        description="Write a GPT2LMHeadModel directory (config.json, model.safetensors, the dataset's tokenizer, "
        "generation_config.json) from checkpoint RUN@STEP, with a model card (README.md) and "
        "tokenlake_lineage.json saying what it was trained on: dataset tag and data commit, stage commits, "
        "sources, mixture, steps, tokens, losses and rollback taint. A tainted checkpoint is refused "
        "unless --allow-tainted.",
    )
    parser.add_argument(
        "checkpoint", metavar="RUN@STEP", help="the checkpoint, as `tokenlake lineage` names it"
    )
    parser.add_argument("--to", required=True, metavar="DIR", help="a new or empty directory")
    parser.add_argument(
        "--allow-tainted", action="store_true",
        help="export a checkpoint trained on data a rollback reverted (the model card says so)",
    )  # fmt: skip
    parser.add_argument(
        "--home", default=None, metavar="DIR",
        help="the runs' root where the checkpoint's files are, if not where its lineage record says "
        "(default: $TOKENLAKE_HOME or ./.tokenlake)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the export's lineage as JSON")
    parser.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    from flows.export import export_checkpoint

    result = export_checkpoint(
        args.checkpoint, args.to, repo_spec=args.repo, home=args.home, allow_tainted=args.allow_tainted
    )
    if args.json:
        print(json.dumps({"directory": str(result.directory), "files": list(result.files), **result.lineage},
                         indent=2, default=str))  # fmt: skip
        return 0
    lineage = result.lineage
    data = lineage["dataset"]
    print(f"exported {result.checkpoint} as {lineage['export']['architecture']} "
          f"({result.parameters:,} parameters) to {result.directory}")  # fmt: skip
    print(f"trained on {data['publish_tag'] or 'data commit'} {data['data_commit'][:12]}: "
          f"{lineage['training']['steps']} steps, {lineage['training']['tokens']:,} tokens")  # fmt: skip
    if result.tainted:
        reasons = "; ".join(r["reason"] for r in lineage["taint"]["reasons"])
        print(f"TAINTED (exported with --allow-tainted, stated in the model card): {reasons}")
    print(f"files: {', '.join(result.files)}")
    return 0
