"""The model card (``README.md``) of an exported checkpoint: its lineage for people, from the same
dict as ``tokenlake_lineage.json`` (:func:`flows.export.gather_lineage`) so the two never disagree."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from training.export_hf import TokenizerFacts


def render_card(lineage: dict[str, Any], tokenizer: TokenizerFacts) -> str:
    ckpt, data, training, taint = (
        lineage["checkpoint"],
        lineage["dataset"],
        lineage["training"],
        lineage["taint"],
    )
    model, export = training["model"], lineage["export"]
    tags = ", ".join(data["tags"]) or "none"
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [tokenlake, gpt2]",
        "---",
        "",
        f"# {ckpt['name']}",
        "",
        f"A {export['architecture']} ({export['parameters']:,} parameters: {model['n_layer']} layers, "
        f"{model['n_head']} heads, width {model['n_embd']}) exported by tokenlake from checkpoint "
        f"`{ckpt['name']}`, trained on dataset {data['publish_tag'] or tags} "
        f"(data commit `{data['data_commit']}`).",
        "",
        *_taint_section(taint),
        "## Dataset",
        "",
        _table(
            ["field", "value"],
            [
                ["repository", data["repository"]],
                ["dataset tag", data["publish_tag"] or "(not a published version)"],
                ["tags of the commit", tags],
                ["data commit", f"`{data['data_commit']}`"],
                ["publish merge", f"`{data['publish_commit']}`" if data["publish_commit"] else ""],
                ["curate flow run", data["publish_flow_run_id"]],
                ["manifest sha256", f"`{data['manifest_sha256']}`"],
                ["mix sha256", f"`{data['mix_sha256']}`"],
                ["tokenizer sha256", f"`{data['tokenizer_sha256']}`"],
            ],
        ),
        "",
        "### Stage commits",
        "",
        _table(
            ["stage", "commit", "config hash", "flow run"],
            [[s["stage"], f"`{s['commit']}`", s["config_hash"], s["flow_run_id"]] for s in lineage["stages"]],
        )
        if lineage["stages"]
        else "No curate stage chain is recorded for this commit.",
        "",
        "### Sources and mixture",
        "",
        _table(
            [
                "source",
                "documents",
                "tokens stored",
                "tokens trained",
                "weight",
                "token budget",
                "epochs planned",
            ],
            [
                [
                    s["name"],
                    _count(s["documents"] if s["documents"] is not None else s["documents_in_shards"]),
                    _count(s["tokens"]),
                    _count(s["trained_tokens"]),
                    " / ".join(f"{w:.4f}" for w in s["weights"]),
                    _count(s["token_budget"]),
                    s["epochs"],
                ]
                for s in lineage["sources"]
            ],
        ),  # fmt: skip
        "",
        "Documents: the version's, after dedup (else those ending in its shards); tokens trained: the "
        "input tokens of the samples this checkpoint's weights saw"
        + (" (not known after a resume onto other data)." if training["data_changes"] else "."),
        "",
        *_mixture_lines(lineage["mixture"]),
        "## Training",
        "",
        _table(
            ["field", "value"],
            [
                ["steps", training["steps"]],
                ["tokens", f"{training['tokens']:,}"],
                ["global batch", f"{training['global_batch']} sequences of {training['seq_len']} tokens"],
                ["parallelism", f"{training['parallel']} on {training['world_size']} process(es)"],
                ["dtype", training["dtype"]],
                ["seed", training["seed"]],
                ["optimizer", json.dumps(training["optim"], sort_keys=True)],
                ["diverging steps rolled back", len(training["stability_rollbacks"])],
                ["resumes onto other data", len(training["data_changes"])],
                ["flow run", ckpt["flow_run_id"] or "none (the trainer ran outside the train flow)"],
                ["code version", ckpt["code_version"]],
                ["saved", _when(ckpt["saved_at"])],
            ],
        ),
        "",
        "## Losses",
        "",
        *_loss_lines(lineage["metrics"]),
        "## Architecture",
        "",
        *_architecture_lines(export, model, tokenizer),
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/directory")',
        'model = AutoModelForCausalLM.from_pretrained("path/to/this/directory")',
        'ids = tokenizer("def main():", return_tensors="pt").input_ids',
        "print(tokenizer.decode(model.generate(ids, max_new_tokens=32)[0]))",
        "```",
        "",
        f"The tokenizer is the dataset's own `tokenizer.json` ({tokenizer.size} tokens). "
        f"`{tokenizer.eod_token}` (id {tokenizer.eod_id}) ends every document in the training data; it "
        "is the BOS, EOS and padding token here. Special-token text inside a prompt is encoded as "
        "plain text, as the training data was.",
        "",
        f"Full lineage, machine-readable: `tokenlake_lineage.json`. Exported {_when(export['exported_at'])} "
        f"by {export['exported_by']}.",
        "",
    ]
    return "\n".join(lines)


def _taint_section(taint: dict[str, Any]) -> list[str]:
    if not taint["tainted"]:
        lines = ["**Rollback taint: none.** No rollback of `main` took this checkpoint's data off `main`."]
        if taint["marks"]:
            lines.append(
                f"Earlier rollbacks marked it ({', '.join(m['rollback'] for m in taint['marks'])}); "
                "its data is good again (restored or re-published since)."
            )
        return [*lines, ""]
    reasons = [f"- {r['reason']}" for r in taint["reasons"]]
    return [
        f"> **TAINTED.** This checkpoint was trained on data a rollback of `main` reverted. "
        f"It was exported anyway, on purpose, with `{taint['exported_with']}`.",
        "",
        *reasons,
        "",
    ]


def _mixture_lines(mixture: dict[str, Any]) -> list[str]:
    spec = mixture["spec"]
    how = (
        f"temperature {spec['temperature']}"
        if spec.get("temperature") is not None
        else "explicit weights"
        if spec.get("weights")
        else "proportional to tokens"
    )
    lines = [
        f"Mixture: {how}, seed {mixture['seed']}, {mixture['total_samples']:,} samples "
        f"({mixture['total_tokens']:,} tokens) planned, {len(mixture['phases'])} phase(s)"
        + (
            ": " + "; ".join(f"samples {p['start_sample']}-{p['stop_sample']}" for p in mixture["phases"])
            if len(mixture["phases"]) > 1
            else ""
        )
        + ". Weights per phase, in order.",
        "",
    ]
    return lines


def _loss_lines(metrics: dict[str, Any]) -> list[str]:
    rows = []
    if "loss" in metrics:
        rows.append(["training loss (the last step's)", _number(metrics["loss"])])
    if "eval_loss" in metrics:
        rows.append(["held-out eval loss", _number(metrics["eval_loss"])])
    for source, value in sorted((metrics.get("eval_loss_by_source") or {}).items()):
        rows.append([f"held-out eval loss, source {source}", _number(value)])
    named = {"loss", "eval_loss", "eval_loss_by_source", "step"}
    rows += [[key, _number(value)] for key, value in sorted(metrics.items()) if key not in named]
    if not rows:
        return ["No loss was recorded with this checkpoint.", ""]
    at = f" (at step {metrics['step']})" if "step" in metrics else ""
    return [f"As recorded with the checkpoint{at}:", "", _table(["loss", "value"], rows), ""]


def _architecture_lines(
    export: dict[str, Any], model: dict[str, Any], tokenizer: TokenizerFacts
) -> list[str]:
    padded = export["vocab_size"] - tokenizer.size
    biases = (
        "trained with biases"
        if export["trained_with_biases"]
        else "trained without biases (`bias = false`): the file holds zero biases, which change no value"
    )
    return [
        f"tokenlake's GPT maps exactly onto `{export['architecture']}`: learned positions "
        f"({export['n_positions']}), pre-norm blocks, the exact GELU (`activation_function: gelu`), "
        f"LayerNorm epsilon {export['layer_norm_epsilon']}, the output head tied to the token embedding; "
        f"{biases}. The vocabulary is {export['vocab_size']} rows"
        + (
            f", the tokenizer's {tokenizer.size} padded to a multiple of 64 (the {padded} extra rows were "
            "never a training target)."
            if padded > 0
            else ", the tokenizer's."
        )
        + f" Weights in {export['dtype']}; dropout {model['dropout']} in training.",
        "",
    ]


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "" if value is None else str(value)


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_number(v)}" for k, v in sorted(value.items()))
    return str(value)


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds") if seconds else ""


def _table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
