"""ShardConfig: the parameters of the shard stage (tokenizer and packing), with runnable defaults."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.tokenize import BYTE_ALPHABET_SIZE, EncoderName


class ShardConfig(BaseModel):
    """Tokenizer training (or reuse) and packing of ``dedup/`` into ``shards/``.

    Defaults suit a CPU demo: a 4,096-token vocabulary and 256-token sequences.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(4096, description="target vocabulary size, special tokens included")
    eod_token: str = Field("<|endoftext|>", min_length=1, description="end-of-document token, always present")
    special_tokens: list[str] = Field(
        default_factory=list, description="extra special tokens after the EOD token"
    )
    tokenizer_sample_mb: float = Field(16.0, gt=0, description="text sampled to train the tokenizer, in MB")
    tokenizer_sample_seed: int = Field(0, description="seed of the tokenizer training sample")
    reuse_tokenizer_from: str | None = Field(
        None, description="a dataset ref whose tokenizer/tokenizer.json is reused instead of training one"
    )
    seq_len: int = Field(
        256, ge=1, le=1 << 20, description="tokens per training sequence (rows hold seq_len + 1)"
    )
    max_sequences_per_shard: int = Field(4096, ge=1, description="sequences per shard at most")
    encoder: EncoderName = Field(
        "tiktoken",
        description="tiktoken (the same ids as tokenizers, faster; a document it might encode differently "
        "is re-encoded by tokenizers and counted) or tokenizers",
    )
    workers: int = Field(1, ge=1, le=256, description="encoding processes; 1 encodes in-process")
    batch_documents: int = Field(1024, ge=1, description="documents per encoding batch")
    weight_seed: int = Field(0, description="seed of the repetition draw that honours document weights")
    max_repeats: int = Field(4, ge=1, description="weights above this are clamped (and counted)")

    @model_validator(mode="after")
    def _check(self) -> ShardConfig:
        specials = self.all_special_tokens
        if len(set(specials)) != len(specials):
            raise ValueError(f"special tokens must be distinct and not repeat eod_token {self.eod_token!r}")
        if self.reuse_tokenizer_from is None and self.vocab_size < BYTE_ALPHABET_SIZE + len(specials) + 1:
            raise ValueError(
                f"vocab_size must be at least {BYTE_ALPHABET_SIZE + len(specials) + 1} "
                f"(256 byte symbols, {len(specials)} special tokens and one merge)"
            )
        return self

    @property
    def all_special_tokens(self) -> list[str]:
        return [self.eod_token, *self.special_tokens]
