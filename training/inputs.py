"""What a trainer reads: the data commit (refused when a rollback reverted it, unless allowed),
its shards streaming into the node's bounded cache, this rank's loader, and the held-out
sequences it evaluates on."""

from __future__ import annotations

from collections.abc import Callable

from formats.rollbacks import Reverted
from training.config import TrainConfig
from training.data import Loader, ShardCache, open_streaming
from training.distributed import DistContext
from training.evaluation import HeldoutEvaluation
from training.loader_pool import Notify, ProcessLoader, make_loader
from training.reverted import RevertedDataRefused, check_training_data
from versioning import DataRepo, open_repo


class TrainInputs:
    def __init__(self, config: TrainConfig, dist: DistContext, repo_spec: str, say: Callable[[str], None]):
        self.cfg, self.dist, self.repo_spec, self.say = config, dist, repo_spec, say
        self.loader: Loader | ProcessLoader | None = None
        repo = open_repo(repo_spec, create=False)
        checked = self._check_data_commit(repo) if dist.is_main else None
        commit, self.reverted, refusal = dist.broadcast(checked)
        if refusal:  # every rank stops with the same sentence
            raise RevertedDataRefused(refusal)
        data = config.data
        self.cache = ShardCache(
            config.cache_dir(),
            warn=say,
            max_bytes=data.cache_max_bytes,
            protect_steps=data.cache_protect_steps,
        )
        self.data = open_streaming(
            repo,
            repo_spec,
            commit,
            self.cache,
            data.heldout_fraction,
            lambda: open_repo(repo_spec, create=False),
            workers=data.fetch_workers if data.loader == "thread" else 1,  # else only evaluation reads here
            fetch_timeout_s=data.fetch_timeout_s,
            warn=say,
        )
        self.binding, self.dataset = self.data.binding, self.data.dataset

    def _check_data_commit(self, repo: DataRepo) -> tuple[str, Reverted | None, str]:
        """Rank 0: the data commit id, the verdict on it when training on it is allowed, or the refusal.

        Here, not only in the train flow: a direct ``python -m training`` and every resume (a
        retry, a torchrun restart) are checked against the rollbacks recorded by then."""
        commit = repo.resolve(self.cfg.commit)
        try:
            return commit, check_training_data(repo, commit, self.cfg.allow_reverted), ""
        except RevertedDataRefused as refused:
            return commit, None, str(refused)

    def start_loader(self, micro_batch: int, notify: Notify) -> Loader | ProcessLoader:
        """This rank's batches (collective), then the held-out sequences, read once."""
        self.loader = make_loader(
            self.cfg,
            self.dist,
            self.dataset,
            self.data.stream,
            self.data.files,
            self.binding.commit,
            self.repo_spec,
            micro_batch,
            notify=notify,
            warn=self.say,
        )
        self._choose_evaluation()
        return self.loader

    def _choose_evaluation(self) -> None:
        """Whole global batches of held-out sequences, so every world size evaluates the same ones."""
        config = self.cfg
        ids = self.dataset.heldout_ids(
            config.data.eval_sequences // config.global_batch * config.global_batch
        )
        if config.eval_every and len(ids[0]) < config.global_batch:
            self.say("evaluation is off: fewer held-out sequences than one global batch")
            ids = (ids[0][:0], ids[1][:0])
        self.dataset.keep_rows(*ids)  # read once: evaluating never waits on the cache
        self.evaluation = HeldoutEvaluation(self.dataset, ids, config.global_batch, self.loader.my_slice)

    def close(self) -> None:
        if self.loader is not None:
            self.loader.close()
        self.data.stream.close()
