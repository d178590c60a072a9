"""MLflow tracking (``--tracking-uri``, off by default) against a real MLflow file store: the train stage logs its
config, every step's metrics, the summary and its published files (the adapter included); a tracking server that
does not answer is a warning, and the stage's published output stands."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from factories import metrics_lines

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.tracking import log_stage_run

mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def file_store(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store for local use only
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "sdarflow-test")
    return (tmp_path / "mlruns").as_uri()


def test_train_logs_params_step_metrics_and_the_adapter(tiny_model, rescored, tmp_path, file_store):
    out = str(tmp_path / "adapter")
    argv = ["train", "--input", rescored, "--model", str(tiny_model), "--output", out, "--mini-batches", "2",
            "--lr", "1e-3", "--tracking-uri", file_store]  # fmt: skip
    assert main(argv) == 0
    client = mlflow.tracking.MlflowClient(tracking_uri=file_store)
    experiment = client.get_experiment_by_name("sdarflow-test")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.data.tags["sdarflow.stage"] == "train" and run.data.tags["sdarflow.output"] == out
    assert run.data.tags["sdarflow.config_hash"] == storage.read_manifest(out, "adapter")["config_hash"]
    assert run.data.params["lr"] == "0.001" and run.data.params["method"] == "sdar"
    # one point per optimizer step, as in metrics.jsonl
    steps = [line["step"] for line in metrics_lines(out)]
    history = client.get_metric_history(run.info.run_id, "loss/total")
    assert [m.step for m in history] == steps == [1, 2]
    assert run.data.metrics["summary/train/steps"] == 2.0
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {
        "adapter_model.safetensors",
        "adapter_config.json",
        "report.html",
        "train_summary.json",
    } <= artifacts


def test_off_by_default_and_a_dead_server_is_a_warning(tmp_path, monkeypatch, caplog):
    assert log_stage_run("", "train", {"lr": 1}, {"x": 1.0}) is None  # off: nothing imported, nothing logged
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    (tmp_path / "report.html").write_text("<p>r</p>")
    with caplog.at_level(logging.WARNING, logger="sdarflow.tracking"):
        run_id = log_stage_run(
            f"http://127.0.0.1:{port}", "evaluate", {"a": 1}, {"test/pass@1": 0.5}, artifacts=Path(tmp_path)
        )
    assert run_id is None
    assert f"could not log the evaluate run to http://127.0.0.1:{port}" in caplog.text
