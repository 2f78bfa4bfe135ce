"""The mix stage: a :class:`~formats.mix.MixSpec` resolved against the shards into ``mix.json``;
the Prefect task is ``tasks.mix.task.mix_task``."""
