"""A curate run that fails because lakeFS is down still removes its run branch once lakeFS is
back (the transaction's rollback hook retries as IO tasks do). Found by
``benchmarks/chaos/lakefs_faults.py``: a run failed by a 30 s outage left its branch behind."""

from __future__ import annotations

import threading

from flows.curate import _delete_run_branch
from tests.lakefs_double import FaultConfig, LakeFSDouble
from tests.versioning.lakefs_backends import connect


class Txn:
    def __init__(self, **values: str):
        self.values = values

    def get(self, key: str) -> str:
        return self.values[key]


def test_the_run_branch_is_deleted_once_lakefs_is_back(tmp_path, monkeypatch):
    with LakeFSDouble(tmp_path / "lakefs") as double:
        monkeypatch.setenv("LAKECTL_SERVER_ENDPOINT_URL", double.endpoint)
        monkeypatch.setenv("LAKECTL_CREDENTIALS_ACCESS_KEY_ID", double.access_key_id)
        monkeypatch.setenv("LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY", double.secret_access_key)
        monkeypatch.setenv("LAKECTL_CONFIG_FILE", str(tmp_path / "none.yaml"))
        repo = connect(double, "outage")
        repo.ensure()
        repo.create_branch("curate-run-1", "main")

        double.faults = FaultConfig(error_rate=1.0)  # down while the hook starts
        healed = threading.Event()

        def heal_after_a_failed_attempt() -> None:
            while double.injected["error"] < 6:  # one whole attempt: the adapter's six tries
                healed.wait(0.01)
            double.faults = FaultConfig()
            healed.set()

        healer = threading.Thread(target=heal_after_a_failed_attempt, daemon=True)
        healer.start()
        _delete_run_branch(Txn(repo_spec="lakefs://outage", branch="curate-run-1"))
        healer.join()
        assert healed.is_set()
        assert set(repo.list_branches()) == {"main"}
