"""What a result records of the code that made it: the commit and the uncommitted changes, where a result file
written into the checkout (bench/results) is not a change to the code."""

from __future__ import annotations

import subprocess

from sdarflow.provenance import code, reuse_key


def _git(repo, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def test_code_names_the_commit_and_changes_but_not_result_files(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "src" / "m.py").write_text("x = 1\n")
    (tmp_path / "bench" / "results" / "r.json").write_text("{}\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "c")
    clean = code(tmp_path / "src")
    assert clean["commit"] == _git(tmp_path, "rev-parse", "HEAD") and clean["uncommitted"] is None

    (tmp_path / "bench" / "results" / "r.json").write_text('{"new": 1}\n')
    assert code(tmp_path / "src") == clean  # a benchmark's output is not a code change

    (tmp_path / "src" / "m.py").write_text("x = 2\n")
    changed = code(tmp_path / "src")
    assert changed["uncommitted"] is not None
    machine = {"cpu": "c", "cpu_capability": "AVX2", "torch": "t", "torch_threads": 1, "cuda": None}
    keys = [reuse_key({**c, "machine": machine}) for c in (clean, changed)]
    assert keys[0] != keys[1]  # a study never reuses a cell made by other code
    # nor one made by other kernels: a CPU of the same name with AVX-512 sums floats in another order
    other = reuse_key({**clean, "machine": {**machine, "cpu_capability": "AVX512"}})
    assert other != keys[0] and other["code"] == keys[0]["code"]


def test_the_machine_names_the_kernels_its_floats_come_from():
    import torch

    from bench.tables import _machine
    from sdarflow.provenance import machine

    m = machine()
    assert m["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert f"({m['cpu_capability']} kernels), {m['cpus']} cores" in _machine(m)
    assert "kernels" not in _machine({**m, "cpu_capability": None})  # a result from before it was recorded


def test_outside_a_checkout_the_commit_is_the_one_an_image_was_built_from_or_none(tmp_path, monkeypatch):
    monkeypatch.delenv("SDARFLOW_COMMIT", raising=False)
    assert code(tmp_path) == {**code(tmp_path), "commit": None, "uncommitted": None}
    monkeypatch.setenv("SDARFLOW_COMMIT", "0123abc")  # images/Dockerfile.* set it from make images' build arg
    assert code(tmp_path) == {**code(tmp_path), "commit": "0123abc", "uncommitted": None}
