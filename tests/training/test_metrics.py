"""The metrics log survives a process killed in the middle of writing a record."""

from __future__ import annotations

import json

from training.metrics import MetricsLog, open_jsonl_for_append, read_metrics


def test_a_torn_last_record_is_cut_off_before_the_next_run_appends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    complete = [{"kind": "train", "step": 1, "loss": 2.5}, {"kind": "train", "step": 2, "loss": 2.25}]
    torn = json.dumps({"kind": "train", "step": 3, "loss": 2.0})[:17]  # killed inside write(2)
    path.write_text("".join(json.dumps(r) + "\n" for r in complete) + torn)
    assert read_metrics(path) == complete  # a reader skips the line being written

    log = MetricsLog(path, total_steps=4, first_step=2, progress=False)
    log.write({"kind": "resume", "step": 2})
    log.close()
    assert read_metrics(path) == [*complete, {"kind": "resume", "step": 2}]


def test_a_file_holding_only_a_torn_line_starts_empty_and_an_intact_file_is_kept(tmp_path):
    torn, intact = tmp_path / "torn.jsonl", tmp_path / "intact.jsonl"
    torn.write_bytes(b'{"step": 1, "sam' * 10_000)  # longer than one read-back chunk, no newline
    intact.write_text('{"step": 1}\n')
    for path in (torn, intact):
        with open_jsonl_for_append(path) as f:
            f.write('{"step": 2}\n')
    assert torn.read_text() == '{"step": 2}\n'
    assert intact.read_text() == '{"step": 1}\n{"step": 2}\n'
