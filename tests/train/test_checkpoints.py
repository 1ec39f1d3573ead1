"""raylite.train's checkpoint bookkeeping, as Ray Train V2's: scores on flattened metrics, retention
and best_checkpoints ordered worst to best, Result.get_best_checkpoint and Result.from_path's errors.

Driven through RunRecorder (the driver side) with reports as the reporter actor hands them over,
so these need no worker processes.
"""
from __future__ import annotations

import logging
import os

import pytest

from raylite.train import CheckpointConfig, Result
from raylite.train.result import RunRecorder


def _run(tmp_path, config: CheckpointConfig, reports: list[dict]) -> Result:
    """One rank-0 report (with a checkpoint) per entry of ``reports``, on a 1-worker run."""
    recorder = RunRecorder(str(tmp_path / "run"), world_size=1, checkpoint_config=config)
    for i, metrics in enumerate(reports):
        name = f"checkpoint_{i:06d}"
        os.makedirs(os.path.join(recorder.run_dir, name))
        recorder.add([(0, 0, i, metrics, name, 1e9 + i)])
    return recorder.finish()


def _names(result: Result) -> list[str]:
    return [os.path.basename(c.path) for c, _ in result.best_checkpoints]


def _on_disk(result: Result) -> list[str]:
    return sorted(n for n in os.listdir(result.path) if n.startswith("checkpoint_"))


ACCS = [0.1, 0.9, 0.3, 0.5, 0.2]


def test_nested_score_attribute_is_looked_up_in_the_flattened_metrics(tmp_path):
    reports = [{"nested": {"acc": a}, "i": i} for i, a in enumerate(ACCS)]
    result = _run(tmp_path, CheckpointConfig(2, "nested/acc", "max"), reports)
    # the best two (0.5 and 0.9), worst to best as in Ray, and the latest kept for resuming
    assert _names(result) == ["checkpoint_000003", "checkpoint_000001"]
    assert _on_disk(result) == ["checkpoint_000001", "checkpoint_000003", "checkpoint_000004"]
    assert os.path.basename(result.checkpoint.path) == "checkpoint_000004"
    assert os.path.basename(result.get_best_checkpoint("nested/acc", "max").path) == "checkpoint_000001"
    assert os.path.basename(result.get_best_checkpoint("nested/acc", "min").path) == "checkpoint_000003"


def test_best_checkpoints_order_min_and_without_score(tmp_path):
    by_loss = _run(tmp_path / "a", CheckpointConfig(3, "loss", "min"), [{"loss": a} for a in ACCS])
    assert [m["loss"] for _, m in by_loss.best_checkpoints] == [0.3, 0.2, 0.1]
    recent = _run(tmp_path / "b", CheckpointConfig(2), [{"loss": a} for a in ACCS])
    assert _names(recent) == ["checkpoint_000003", "checkpoint_000004"]   # report order


def test_a_result_without_the_score_attribute_scores_lowest_and_is_logged(tmp_path, caplog):
    reports = [{"i": 0, "acc": 0.5}, {"i": 1}, {"i": 2, "acc": 0.9}, {"i": 3}, {"i": 4, "acc": 0.1}]
    with caplog.at_level(logging.ERROR, logger="raylite.train"):
        result = _run(tmp_path, CheckpointConfig(2, "acc", "max"), reports)
    assert "Result dict has no key: acc" in caplog.text
    assert _names(result) == ["checkpoint_000000", "checkpoint_000002"]
    assert _on_disk(result) == ["checkpoint_000000", "checkpoint_000002", "checkpoint_000004"]
    with pytest.raises(ValueError, match="must be numerical"):
        _run(tmp_path / "s", CheckpointConfig(1, "acc"), [{"acc": "high"}])


def test_result_from_path_raises_for_a_missing_or_foreign_directory(tmp_path):
    with pytest.raises(RuntimeError, match="doesn't exist"):
        Result.from_path(tmp_path / "missing")
    with pytest.raises(RuntimeError, match="result.json doesn't exist"):
        Result.from_path(tmp_path)
    result = _run(tmp_path, CheckpointConfig(), [{"x": 1}])
    assert Result.from_path(result.path).metrics["x"] == 1
    with pytest.raises(RuntimeError, match="No checkpoint"):
        Result(None, None).get_best_checkpoint("x", "max")
