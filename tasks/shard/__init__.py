"""The shard stage: tokenizer, packing, manifest gate, verification; Prefect task in ``tasks.shard.task``."""
