"""A tokenlake checkpoint as a Hugging Face transformers model directory: torch, safetensors and
tokenizers, no Prefect and no transformers.

The architecture is ``GPT2LMHeadModel``, because :mod:`training.model` maps onto it exactly:

* learned position embeddings (``wpe``) added to the token embeddings (``wte``), pre-norm blocks
  (LayerNorm -> attention -> residual, LayerNorm -> MLP -> residual), a final LayerNorm;
* attention with a fused q/k/v projection split in that order, heads of ``n_embd / n_head``,
  scores scaled by ``1 / sqrt(head size)``, causal; an MLP of ``4 * n_embd`` with the exact (erf)
  GELU, which transformers calls ``"gelu"`` (GPT-2's own ``"gelu_new"`` is the tanh approximation);
* LayerNorm epsilon as the model's modules have it (PyTorch's default, 1e-5, GPT-2's too);
* the output head tied to the token embedding (``tie_word_embeddings``: the file holds one matrix);
* biases: GPT-2 always has them. A model trained with ``bias=False`` (tokenlake's default) gets
  zero biases: adding zero changes no value, so the model computes what it computed without them
  (and GPT-2, not a bias-free architecture, is what every tool that reads the format runs).

GPT-2's ``Conv1D`` keeps its weight as ``(in, out)``, the transpose of ``nn.Linear``'s. The
vocabulary is the model's, padded to a multiple of 64 (:meth:`training.config.ModelConfig.gpt_config`):
the tokenizer has fewer tokens, and the extra rows, never targets in training, stay so the logits
equal tokenlake's.

Checkpoints of DDP and FSDP2 runs hold the same thing: ``model.pt`` is the full, unsharded state
dict (FSDP2 gathers it with ``get_model_state_dict(full_state_dict=True)``, see
:mod:`training.train_state`), loaded here with ``torch.load(weights_only=True)`` after the
checkpoint's digests verify.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from training.checkpoint import CheckpointError, CheckpointInfo, load_payload, verify_checkpoint
from training.config import ModelConfig
from training.model import GPT, GPTConfig

ARCHITECTURE = "GPT2LMHeadModel"
MODEL_TYPE = "gpt2"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
MODEL_FILE = "model.pt"


class ExportError(ValueError):
    """A checkpoint or tokenizer that cannot be exported; the message says which and why."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    info: CheckpointInfo
    model: GPT  # tokenlake's own model with the checkpoint's weights, in eval mode, fp32 on the CPU


@dataclass(frozen=True)
class TokenizerFacts:
    """What the exported tokenizer files say about the dataset's tokenizer."""

    json: str  # the dataset's tokenizer.json, verbatim
    eod_token: str  # the end-of-document token: also BOS and EOS for generation
    eod_id: int
    special_tokens: tuple[str, ...]  # every special token, the end-of-document token first
    size: int  # tokens, special tokens included (the model's vocabulary may be larger: padding)


def load_checkpoint(path: Path) -> LoadedCheckpoint:
    """Verify the checkpoint at ``path`` and load its weights into tokenlake's model."""
    try:
        info = verify_checkpoint(path)
        state = load_payload(info, (MODEL_FILE,))[MODEL_FILE]
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    config = model_config(info.meta, state)
    model = GPT(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ExportError(
            f"{path}: {MODEL_FILE} does not fit the model its config describes: {exc}"
        ) from None
    return LoadedCheckpoint(info, model.float().eval())


def model_config(meta: dict[str, Any], state: dict[str, torch.Tensor]) -> GPTConfig:
    """The architecture of a checkpoint: layers, heads, width and biases from its training config,
    the (padded) vocabulary and the positions from its embeddings."""
    try:
        model = ModelConfig(**meta["config"]["model"])
        vocab_size, _ = state["wte.weight"].shape
        block_size, _ = state["wpe.weight"].shape
    except KeyError as exc:
        raise ExportError(f"the checkpoint lacks {exc} (not a checkpoint of training.model.GPT)") from None
    return GPTConfig(vocab_size=vocab_size, block_size=block_size, **model.model_dump())


def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """``model``'s weights under GPT2LMHeadModel's names; fresh, contiguous tensors (safetensors
    stores no shared or strided ones). The tied output head is left out: transformers ties it."""
    out: dict[str, torch.Tensor] = {
        "transformer.wte.weight": model.wte.weight,
        "transformer.wpe.weight": model.wpe.weight,
    }

    def norm(name: str, module: torch.nn.LayerNorm) -> None:
        out[f"{name}.weight"] = module.weight
        out[f"{name}.bias"] = module.bias if module.bias is not None else torch.zeros_like(module.weight)

    def conv1d(name: str, module: torch.nn.Linear) -> None:
        out[f"{name}.weight"] = module.weight.t()
        out[f"{name}.bias"] = (
            module.bias if module.bias is not None else module.weight.new_zeros(module.out_features)
        )

    for i, block in enumerate(model.blocks):
        prefix = f"transformer.h.{i}"
        norm(f"{prefix}.ln_1", block.ln_1)
        conv1d(f"{prefix}.attn.c_attn", block.attn.qkv)
        conv1d(f"{prefix}.attn.c_proj", block.attn.proj)
        norm(f"{prefix}.ln_2", block.ln_2)
        conv1d(f"{prefix}.mlp.c_fc", block.mlp.fc)
        conv1d(f"{prefix}.mlp.c_proj", block.mlp.proj)
    norm("transformer.ln_f", model.ln_f)
    return {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in out.items()}


def layer_norm_epsilon(model: GPT) -> float:
    """The epsilon of every LayerNorm of ``model``: GPT-2's config has one for all of them."""
    epsilons = {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)}
    if len(epsilons) != 1:
        raise ExportError(f"GPT-2 has one LayerNorm epsilon; this model has {sorted(epsilons)}")
    return epsilons.pop()


def gpt2_config(model: GPT, tokenizer: TokenizerFacts) -> dict[str, Any]:
    """``config.json`` of the GPT2LMHeadModel that computes what ``model`` does."""
    cfg = model.config
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size,
        "n_embd": cfg.n_embd,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": model.blocks[0].mlp.fc.out_features,
        "activation_function": "gelu",  # F.gelu's exact form (training/model.py's MLP)
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "layer_norm_epsilon": layer_norm_epsilon(model),
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.eod_id,
        "eos_token_id": tokenizer.eod_id,
        "use_cache": True,
        "dtype": "float32",
    }


def tokenizer_facts(tokenizer_json: str, eod_id: int) -> TokenizerFacts:
    """The special tokens of the dataset's ``tokenizer.json`` (its added tokens marked special)
    and the end-of-document token, the id the manifest names. Read by ``tokenizers`` itself, so
    any model of it (BPE, Unigram, WordPiece) has its size counted the same way."""
    try:
        tokenizer = Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # the Rust side raises a bare Exception for a malformed file
        raise ExportError(f"the dataset's tokenizer.json does not load in tokenizers ({exc})") from None
    added = sorted(tokenizer.get_added_tokens_decoder().items())
    by_id = {token_id: token.content for token_id, token in added}
    if eod_id not in by_id:
        raise ExportError(
            f"the manifest's end-of-document id {eod_id} is not a special token of the tokenizer"
        )
    specials = [by_id[eod_id], *(t.content for i, t in added if t.special and i != eod_id)]
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    return TokenizerFacts(tokenizer_json, by_id[eod_id], eod_id, tuple(specials), size)


def tokenizer_config(tokenizer: TokenizerFacts, block_size: int) -> dict[str, Any]:
    """``tokenizer_config.json`` for ``PreTrainedTokenizerFast`` over the dataset's ``tokenizer.json``.

    ``split_special_tokens``: special-token text inside a document is encoded as plain text, as the
    shard stage encodes it (``encode_special_tokens``, :mod:`tasks.tokenize`), so the same text
    gives the same ids; no BOS or EOS is added to an encoding, as none is in the shards. The
    end-of-document token also pads a batch (GPT-2 has no padding token of its own), as
    ``generation_config.json`` says."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.eod_token,
        "eos_token": tokenizer.eod_token,
        "pad_token": tokenizer.eod_token,
        "additional_special_tokens": list(tokenizer.special_tokens[1:]),
        "model_max_length": block_size,
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }


def special_tokens_map(tokenizer: TokenizerFacts) -> dict[str, Any]:
    """``special_tokens_map.json``: transformers 4 reads it; 5 reads the same from the config."""
    return {
        "bos_token": tokenizer.eod_token,
        "eos_token": tokenizer.eod_token,
        "pad_token": tokenizer.eod_token,
        "additional_special_tokens": list(tokenizer.special_tokens[1:]),
    }


def generation_config(tokenizer: TokenizerFacts) -> dict[str, Any]:
    """Greedy by default; a document ends at the end-of-document token, which also pads a batch."""
    return {
        "bos_token_id": tokenizer.eod_id,
        "eos_token_id": tokenizer.eod_id,
        "pad_token_id": tokenizer.eod_id,
        "do_sample": False,
    }


def write_model_files(directory: Path, model: GPT, tokenizer: TokenizerFacts) -> list[str]:
    """Write the model and tokenizer files of a transformers model directory into ``directory``
    (which exists); returns the names written. The model card is the caller's."""
    if tokenizer.size > model.config.vocab_size:
        raise ExportError(
            f"the tokenizer has {tokenizer.size} tokens, more than the model's vocabulary of "
            f"{model.config.vocab_size}: this checkpoint was not trained with this tokenizer"
        )
    block_size = model.config.block_size
    save_file(gpt2_state_dict(model), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / TOKENIZER_FILE).write_text(tokenizer.json)
    documents = {
        "config.json": gpt2_config(model, tokenizer),
        "generation_config.json": generation_config(tokenizer),
        "tokenizer_config.json": tokenizer_config(tokenizer, block_size),
        "special_tokens_map.json": special_tokens_map(tokenizer),
    }
    for name, body in documents.items():
        write_json(directory / name, body)
    return [WEIGHTS_FILE, TOKENIZER_FILE, *documents]


def write_json(path: Path, body: Any) -> None:
    path.write_text(json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")


def fsync_tree(directory: Path) -> None:
    """Flush every file of ``directory`` and the directory itself to disk (before it is renamed into place)."""
    for path in directory.iterdir():
        with path.open("rb") as f:
            os.fsync(f.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
