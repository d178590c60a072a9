"""The whole DAG through the KFP local runner (real subprocess tasks), on a local folder and on S3, and the
compiled pipeline spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from factories import FAKE_BASE_ID, FAKE_PROTOCOL, dag_tasks, fake_adapter, fake_adapter_id

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.demo import run_demo
from sdarflow.schema import RESCORED_SCHEMA, TRAJECTORY_SCHEMA


def check_summary(summary: dict) -> None:
    storage.read_table(summary["trajectories"], kind="trajectories", schema=TRAJECTORY_SCHEMA)
    storage.read_table(summary["rescored"], kind="rescored", schema=RESCORED_SCHEMA)
    storage.read_manifest(summary["skills"], "skills")
    storage.read_manifest(summary["adapter"], "adapter")
    report = storage.read_json(storage.join(summary["eval_report"], "report.json"))
    assert set(report["splits"]) == {"test", "ood"}
    assert storage.exists(storage.join(summary["registry"], "sdar-policy", "versions", "1", "lineage.json"))
    # the gate's reference for a first version: the base model's evaluation, kept with the version
    base_report = storage.join(summary["registry"], "sdar-policy", "versions", "1", "base_eval_report.json")
    assert storage.read_json(base_report)["adapter"] == "base"
    # the base model is evaluated on the rounds' tasks, with its interval and counts, and the rounds compare with it
    test = report["splits"]["test"]
    for figures in [summary["base"]["test"], *(r["eval"]["test"] for r in summary["rounds"])]:
        lo, hi = figures["pass@1_ci95"]
        assert 0.0 <= lo <= figures["pass@1"] <= hi <= 1.0 and hi > 0.0
        assert figures["tasks_x_samples"] == f"{test['n_tasks']} x {test['samples_per_task']}"
    assert "Δ vs baseline" in storage.read_bytes(storage.join(summary["eval_report"], "report.md")).decode()
    # the summary is the run report's JSON: every round, the base model, three transcripts (also in HTML)
    data = json.loads(storage.read_member(summary["run_report"], "run_report.json"))
    assert {k: summary[k] for k in data} == data
    assert [r["round"] for r in data["rounds"]] == list(range(len(data["rounds"])))
    # which engine generated each round and how fast: auto is hf for the toy on a CPU
    assert all(r["rollout"]["engine"] == "hf" and r["rollout"]["tokens_per_s"] > 0 for r in data["rounds"])
    # what made the figures, the CPU kind among it: the toy's build differs between x86 CPU kinds
    made_by = summary["made_by"]
    assert made_by["machine"]["cpu"] and made_by["base_model"]["content_id"] and made_by["commit"]
    assert set(data["transcripts"]) == {"best", "median", "worst"}
    assert data["rounds"][-1]["eval"]["test"]["vs_base"]["tasks"] == test["n_tasks"]
    page = storage.read_member(summary["run_report"], "report.html").decode()
    assert "How to read this" in page and "Transcript: best episode of the last round" in page
    # every registered version's README.md is its model card, not PEFT's template
    card = storage.read_bytes(storage.join(summary["registry"], "sdar-policy", "versions", "1", "README.md"))
    assert card.decode().split("---\n", 2)[2].lstrip().startswith("# sdar-policy v1")


@pytest.mark.slow
def test_demo_dag_on_local_storage(tiny_model, tmp_path):
    summary = run_demo(tmp_path / "demo", rounds=2, preset="smoke", base_model=str(tiny_model))
    assert (tmp_path / "demo" / "run_report.html").read_text().startswith("<!DOCTYPE html>")
    assert len(json.loads((tmp_path / "demo" / "summary.json").read_text())["rounds"]) == 2
    assert summary["trajectories"].startswith(str(tmp_path / "demo" / "store"))
    check_summary(summary)
    # round 1 generated with round 0's adapter
    rows = storage.read_table(summary["trajectories"], kind="trajectories", schema=TRAJECTORY_SCHEMA)
    assert set(rows["policy_version"].to_pylist()) == {summary["adapter"].replace("round=1", "round=0")}
    assert storage.exists(storage.join(summary["registry"], "sdar-policy", "versions", "2", "lineage.json"))
    # the typed artifacts the tasks exchanged point at what each stage published (a copy of its manifest)
    runs = tmp_path / "demo" / "kfp-local"
    for task, name, kind in (
        ("generate", "trajectories", "trajectories"),
        ("extract-skills", "library", "skills"),
        ("rescore", "rescored", "rescored"),
        ("train", "trained", "adapter"),
        ("evaluate", "evaluation", "eval-report"),
    ):
        (artifact,) = runs.glob(f"*/{task}/{name}")
        assert json.loads(artifact.read_text())["kind"] == kind, task


@pytest.mark.slow
def test_a_scheduled_run_trains_on_new_tasks_with_new_seeds_and_cannot_loosen_the_gate(tiny_model, tmp_path):
    """Two runs as ``pipeline schedule`` starts them (from production, promoting through the gate), through the
    KFP local runner: the second plays train tasks the first did not, with the next seed, is judged on evaluation
    tasks the first was not (with production evaluated on them too), and its looser ``gate`` parameter is refused
    and audited, production unchanged."""
    import kfp.local

    from pipelines.training import build_training_pipeline
    from sdarflow.registry import Registry
    from sdarflow.train.warmstart import SEED_SKILLS

    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    pipeline = build_training_pipeline(rounds=1, preset="smoke")
    store = str(tmp_path / "store")
    scheduled = {
        "storage": store,
        "base_model": str(tiny_model),
        "seed_skills": str(tiny_model / SEED_SKILLS),
        "start_adapter": "production",
        "promote_to": "production",
        "eval_tasks": 2,  # the fewest a gate compares
    }
    pipeline(**scheduled, run_id="nightly-1")
    # no production yet: nothing to evaluate it on (and the tiny model does not beat the base: an operator
    # promotes it)
    assert not storage.exists(storage.join(store, "runs", "nightly-1", "production-evaluation"))
    registry = Registry(storage.join(store, "registry"))
    production = 1
    registry.promote("sdar-policy", production, force=True, reason="the test's production")
    registry.set_gate("sdar-policy", "production", {"min_tasks": 2}, reason="the test evaluates 2 tasks")
    pipeline(**scheduled, run_id="nightly-2", gate={"min_gain": -1.0})

    def played(run_id: str) -> tuple[int, set[str], set[str]]:
        config = yaml.safe_load(storage.read_bytes(storage.join(store, "runs", run_id, "pipeline.yaml")))
        uri = storage.join(store, "runs", run_id, "round=0", "generate")
        rows = storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA)
        report = storage.read_json(storage.join(store, "runs", run_id, "round=0", "evaluate", "report.json"))
        return (
            config["seed"],
            set(rows.column("task_id").to_pylist()),
            set(report["splits"]["test"]["task_successes"]),
        )

    (seed1, tasks1, judged1), (seed2, tasks2, judged2) = played("nightly-1"), played("nightly-2")
    assert seed2 == seed1 + 1 and tasks2 and not tasks1 & tasks2
    assert judged2 and not judged1 & judged2
    cursor = registry.lineage("sdar-policy", 2)["cursor"]
    assert (cursor["next_task"], cursor["next_eval_task"]) == (2 * len(tasks1), 2 * len(judged1))
    # the base model and production on the second run's tasks: the gate pairs them with the candidate
    assert len(list(Path(store, "cache", "base-evaluations").iterdir())) == 2
    again = storage.read_json(
        storage.join(store, "runs", "nightly-2", "production-evaluation", "report.json")
    )
    assert set(again["splits"]["test"]["task_successes"]) == judged2
    refused = registry.audit_log("sdar-policy")[-1]
    assert (refused["event"], refused["version"]) == ("promote-refused", 2)
    assert "min_gain -1 is looser than the registry's" in json.dumps(refused)
    against = {c["against"] for c in refused["gate_checks"]}
    assert against == {f"production v{production} (same tasks)", "base model"}
    assert all(c["paired"] for c in refused["gate_checks"])
    # the second run again, as a fixed-data schedule would start it while production stays v1: nothing new to
    # train, so the run stops after prepare, saying so, and registers nothing
    config = yaml.safe_load(storage.read_bytes(storage.join(store, "runs", "nightly-2", "pipeline.yaml")))
    again = {k: v for k, v in config.items() if k not in ("run_id", "shards")}
    again.update(start_adapter="production", data_cursor="fixed")
    skipped = pipeline(**again, run_id="nightly-3")
    assert skipped.output.startswith("skipped: nothing changed since run nightly-2 registered sdar-policy v2")
    assert registry.versions("sdar-policy") == [1, 2]
    assert not storage.exists(storage.join(store, "runs", "nightly-3", "round=0"))
    assert registry.aliases("sdar-policy").get("production") == production
    # the run report says so, against the shared base evaluation
    report = storage.join(store, "runs", "nightly-2", "report")
    data = json.loads(storage.read_member(report, "run_report.json"))
    assert data["promotion"].startswith("refused: ") and data["base"]["test"]
    assert "<h2>Promotion</h2>" in storage.read_member(report, "report.html").decode()


@pytest.mark.slow
def test_demo_dag_on_s3_with_the_solution_teacher(tiny_model, tmp_path, s3_root):
    summary = run_demo(
        tmp_path / "demo",
        storage_root=s3_root,
        rounds=1,
        preset="smoke",
        base_model=str(tiny_model),
        options="solution",
    )
    for key in ("trajectories", "skills", "rescored", "adapter", "eval_report", "registry"):
        assert summary[key].startswith(s3_root), key
    check_summary(summary)
    assert not (tmp_path / "demo" / "store").exists()
    # the teacher read each game's walkthrough; the lineage and the run report say so
    assert storage.read_manifest(summary["rescored"])["teacher_context"] == "solution"
    lineage = storage.read_json(
        storage.join(summary["registry"], "sdar-policy", "versions", "1", "lineage.json")
    )
    assert lineage["teacher_contexts"] == ["solution"]
    report = (tmp_path / "demo" / "run_report.html").read_text()
    assert "privileged context: solution. The solution teacher reads what only training sees" in report


def test_the_run_report_names_the_teacher_and_a_control():
    from sdarflow.run_report import _teacher_text

    assert _teacher_text([{"teacher_contexts": ["skills"]}]) == "The teacher's privileged context: skills."
    # a round that continued from a control's adapter makes the run one, whatever its own teacher
    text = _teacher_text([{"teacher_contexts": ["skills"]}, {"teacher_contexts": ["skills", "synthetic"]}])
    assert text.startswith("The teacher's privileged context: skills, synthetic. The synthetic teacher reads")
    assert "refuses its versions for production unless forced" in text


def test_a_bad_demo_option_fails_before_anything_is_written(tmp_path):
    from sdarflow.errors import ConfigError

    with pytest.raises(ConfigError, match="demo --options names unknown or repeated option"):
        run_demo(tmp_path / "demo", options="solutoin")
    assert not (tmp_path / "demo").exists()


def test_compiled_spec_has_every_stage(tmp_path, capsys):
    out = tmp_path / "pipeline.yaml"
    assert main(["pipeline", "compile", "--output", str(out), "--rounds", "1", "--allow-release-tags"]) == 0
    spec = next(yaml.safe_load_all(out.read_text()))  # the second document is the Kubernetes platform spec
    tasks = dag_tasks(spec)
    assert {"prepare", "generate", "extract-skills", "rescore", "train", "evaluate", "register"} <= set(tasks)
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["sdar_coef"]["defaultValue"] == 0.01 and params["gate_beta"]["defaultValue"] == 5.0
    assert params["method"]["defaultValue"] == "sdar"


@pytest.mark.slow
def test_demo_dag_with_two_generate_shards(tiny_model, tmp_path):
    """generate fans out over a ParallelFor; extract-skills, rescore and register read the union of the shards."""
    summary = run_demo(tmp_path / "demo", rounds=2, preset="smoke", base_model=str(tiny_model), shards=2)
    shards = summary["trajectories"]
    assert [uri.rsplit("/", 1)[1] for uri in shards] == ["shard=0", "shard=1"]
    check_summary(summary)
    tables = [storage.read_table(u, kind="trajectories", schema=TRAJECTORY_SCHEMA) for u in shards]
    tasks = [set(t["task_id"].to_pylist()) for t in tables]
    assert tasks[0] and tasks[1] and not tasks[0] & tasks[1]  # each shard rolled out its own tasks
    rescored = storage.read_table(summary["rescored"], kind="rescored", schema=RESCORED_SCHEMA)
    assert rescored.num_rows == sum(t.num_rows for t in tables)  # the union of the shards was rescored
    assert storage.read_manifest(summary["rescored"])["inputs"][: len(shards)] == shards
    # round 1's shards generated with round 0's adapter
    round0 = summary["adapter"].replace("round=1", "round=0")
    assert {v for t in tables for v in t["policy_version"].to_pylist()} == {round0}
    lineage = storage.read_json(
        storage.join(summary["registry"], "sdar-policy", "versions", "2", "lineage.json")
    )
    assert lineage["round"] == 1 and set(shards) <= set(lineage["data"])  # versions follow the rounds


# ------------------------------------------------------------------------------------- the promotion pipeline


def eval_report(test: list[int], adapter: str = "file:///adapter") -> dict:
    """Successes of 4 samples on each of 10 test tasks (ood: 2 of 4 on each of 10), as `sdarflow evaluate`
    reports."""

    def split(counts: list[int]) -> dict:
        pass_at_4 = sum(c > 0 for c in counts) / len(counts)  # with 4 samples: solved at least once
        return {
            "n_tasks": len(counts),
            "samples_per_task": 4,
            "ci95": {},
            "by_task_type": {},
            "pass_at_k": {"1": sum(counts) / (4 * len(counts)), "4": pass_at_4},
            "task_successes": {f"t{i}": c for i, c in enumerate(counts)},
        }

    splits = {"test": split(test), "ood": split([2] * 10)}
    return {
        "adapter": adapter,
        "base_model": "tiny",
        "splits": splits,
        "env": "tool-use",
        "protocol": FAKE_PROTOCOL | {"tasks": 10},
        "adapter_id": None if adapter == "base" else fake_adapter_id(),  # what fake_adapter() makes
        "base_id": FAKE_BASE_ID,
    }


@pytest.fixture
def registry_with_production(tmp_path):
    """v1 (2 of 4 on each of 10 test tasks) in production, having beaten the base model (1 of 4); v2 raised
    pass@1 but lost pass@4 (all or nothing per task); v3 gained on 9 tasks and lost none."""
    from sdarflow.registry import Registry

    registry = Registry(tmp_path / "registry")
    registry.set_gate("sdar-policy", "production", {"min_tasks": 10}, reason="the reports have 10 tasks")
    base = eval_report([1] * 10, adapter="base")
    for i, test in enumerate([[2] * 10, [4] * 7 + [0] * 3, [3] * 9 + [2]], start=1):
        registry.register(
            "sdar-policy",
            fake_adapter(tmp_path / f"a{i}"),
            eval_report(test),
            {"run_id": "r"},
            base_eval_report=base if i == 1 else None,
        )
    registry.promote("sdar-policy", 1)
    return registry


def test_promotion_pipeline_in_the_local_runner(registry_with_production, tmp_path, capfd):
    import kfp.local

    from pipelines.kube import KubeOptions
    from pipelines.promotion import build_promotion_pipeline

    registry = registry_with_production
    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    pipeline = build_promotion_pipeline(KubeOptions())  # the cluster wiring; the local runner ignores it
    uri = str(registry.uri)

    capfd.readouterr()
    with pytest.raises(RuntimeError):  # the gate refuses v2: the task (and the run) fails
        pipeline(registry=uri, version="2")
    logs = capfd.readouterr()
    # the skew-corrected bound of seven ties and three -1s (worked out in tests/evaluate/test_compare.py)
    assert "test pass@4 vs production v1: 0.70 - 1.00 = -0.30, lower bound -0.6343" in logs.out + logs.err
    assert registry.aliases("sdar-policy")["production"] == 1

    task = pipeline(registry=uri, version="3")
    assert task.output == "sdar-policy production -> v3 (gate: passed)"
    assert registry.aliases("sdar-policy")["production"] == 3
    event = [e for e in registry.audit_log("sdar-policy") if e["event"] == "promote"][-1]
    assert event["by"].startswith("kfp-run:") and "{{" not in event["by"]  # the run id, not the placeholder

    task = pipeline(registry=uri, version="2", force=True, reason="hotfix: v3 breaks tool calls")
    assert task.output.endswith("(gate: overridden)")
    assert registry.alias_history("sdar-policy")[-1]["reason"] == "hotfix: v3 breaks tool calls"


# ------------------------------------------------------------------------------- pipeline config, no DAG


def make_config(tmp_path, **overrides):
    from sdarflow.pipeline_config import PipelineConfig

    return PipelineConfig(storage=str(tmp_path / "store"), base_model=str(tmp_path / "base"), **overrides)


def test_replay_rounds_name_the_earlier_rounds_rollouts(tmp_path):
    from sdarflow.pipeline_config import stage_config

    replay = {"train": {"replay_rounds": 2, "sft_ratio": 0.25}}
    pc = make_config(tmp_path, run_id="r1", stage_settings=replay)
    assert stage_config(pc, "train", 0, input=["x"]).replay == []
    cfg = stage_config(pc, "train", 3, input=["x"])
    assert [u.split("/runs/r1/")[1] for u in cfg.replay] == ["round=1/generate", "round=2/generate"]
    assert cfg.replay == [stage_config(pc, "generate", r, adapter="").output for r in (1, 2)]
    sharded = stage_config(
        make_config(tmp_path, run_id="r1", tasks=4, shards=2, stage_settings=replay), "train", 1
    )
    assert [u.split("/runs/r1/")[1] for u in sharded.replay] == [
        "round=0/generate/shard=0",
        "round=0/generate/shard=1",
    ]


def test_generate_shards_get_their_own_output(tmp_path):
    from sdarflow.pipeline_config import stage_config

    pc = make_config(tmp_path, run_id="r1", tasks=4, shards=2)
    cfg = stage_config(pc, "generate", 1, adapter="", shard=1)
    assert (cfg.shard, cfg.num_shards) == (1, 2)
    assert cfg.output.endswith("runs/r1/round=1/generate/shard=1")
    single = stage_config(make_config(tmp_path, run_id="r1"), "generate", 1, adapter="", shard=0)
    assert single.output.endswith("runs/r1/round=1/generate") and single.num_shards == 1
    # a component passes the single-dataset input and the shard list together; the empty one is dropped
    rescore = stage_config(pc, "rescore", 1, input=["", "s0", "s1"], skills="k", adapter="a")
    assert rescore.input == ["s0", "s1"]
    assert getattr(rescore, "num_shards", 1) == 1  # one rescore task reads every generate shard


@pytest.mark.parametrize("option", ["solution", "synthetic", "synthetic-noise"])
def test_a_privileged_teacher_reaches_rescore_alone(tmp_path, option):
    # what a solution or the synthetic control knows goes to rescore's teacher and nowhere else: every other
    # stage's config (generate's and evaluate's prompts, the skill extractor, train, the registry) is the same
    from sdarflow.pipeline_config import stage_config
    from sdarflow.stages import STAGES

    plain, taught = make_config(tmp_path, run_id="r1"), make_config(tmp_path, run_id="r1", options=option)
    for stage in STAGES:
        # register's request is the hash of what the run trains: a run taught otherwise is another request
        a, b = (
            {k: v for k, v in stage_config(pc, stage, 1).to_dict().items() if k != "request"}
            for pc in (plain, taught)
        )
        assert (a == b) == (stage != "rescore"), stage
    assert stage_config(taught, "rescore", 1).teacher_context == option.split("-")[0]


def test_each_round_plays_the_next_tasks(tmp_path):
    from sdarflow.errors import ConfigError
    from sdarflow.pipeline_config import stage_config

    pc = make_config(tmp_path, run_id="r1", tasks=4)
    assert [stage_config(pc, "generate", r, adapter="").first_task for r in range(3)] == [0, 4, 8]
    pc = make_config(tmp_path, run_id="r1", tasks=4, stage_settings={"generate": {"first_task": 100}})
    assert stage_config(pc, "generate", 2, adapter="").first_task == 108
    pc = make_config(tmp_path, run_id="r1", tasks=4, stage_settings={"generate": {"first_task": None}})
    with pytest.raises(ConfigError, match=r"first_task \(None\) and tasks \(4\) must be whole numbers"):
        stage_config(pc, "generate", 1, adapter="")
    # the overfit check: every round replays round 0's tasks (new samples: the seeds derive from the round)
    pc = make_config(
        tmp_path, run_id="r1", tasks=4, round_tasks="same", stage_settings={"generate": {"first_task": 100}}
    )
    assert [stage_config(pc, "generate", r, adapter="").first_task for r in range(3)] == [100, 100, 100]
    assert [stage_config(pc, "generate", r, adapter="").round for r in range(3)] == [0, 1, 2]


def test_a_run_continues_after_the_registered_tasks_with_the_next_seed(registry_with_production, tmp_path):
    from sdarflow.errors import ConfigError
    from sdarflow.pipeline_config import load, prepare, stage_config

    registry = registry_with_production  # v1-v3 were registered by hand, without a cursor: the settings stand

    def started(**overrides):
        settings = {"tasks": 4, "seed": 7, "eval_tasks": 3, **overrides}
        pc = load(prepare(make_config(tmp_path, registry=str(registry.uri), **settings)))
        played = [stage_config(pc, "generate", r) for r in (0, 1)]
        evaluated = {
            stage_config(pc, "evaluate", r).first_task for r in (0, 1)
        }  # every round on the same tasks
        return played[0].seed, [g.first_task for g in played], evaluated

    assert started() == (7, [0, 4], {0})
    # round 1 of a run registers where its train and evaluation tasks stopped, with its seed ...
    pc = make_config(tmp_path, run_id="r", registry=str(registry.uri), tasks=4, seed=7, eval_tasks=3)
    cursor = stage_config(pc, "register", 1, adapter="a", eval_report="e").cursor
    assert cursor == {"env": pc.env, "next_task": 8, "seed": 7, "next_eval_task": 3}
    registry.register("sdar-policy", fake_adapter(tmp_path / "a4"), eval_report([1] * 10), {"cursor": cursor})
    # ... and the next run starts there with the next seed, whether v4 was promoted or not
    assert started() == (8, [8, 12], {3})
    moved = {"generate": {"seed": 3}, "evaluate": {"first_task": 0}}  # stage settings move on too
    assert started(stage_settings=moved) == (8, [8, 12], {3})
    assert started(data_cursor="fixed") == (7, [0, 4], {0})  # to reproduce a run
    assert started(env="search-qa") == (7, [0, 4], {0})  # another env's tasks are another sequence
    # a version registered by hand with an earlier cursor (another seed too) cannot rewind the tasks
    rewound = {"cursor": {**cursor, "next_task": 0, "next_eval_task": 0, "seed": 20}}
    registry.register("sdar-policy", fake_adapter(tmp_path / "a5"), eval_report([1] * 10), rewound)
    assert started() == (21, [8, 12], {3})  # the furthest tasks, the newest seed + 1
    # ... nor replay a seed: after a newest version recording seed 6, 7 was v4's, so the run takes 8
    lower = {"cursor": {**cursor, "seed": 6}}
    registry.register("sdar-policy", fake_adapter(tmp_path / "a6"), eval_report([1] * 10), lower)
    assert started() == (8, [8, 12], {3})
    # a cursor that is not one is refused at register, so it can never fail a later scheduled run
    problems = (({"next_task": -1}, "next_task = -1 must be >= 0"), ({"seed": "x"}, "seed"))
    for i, (bad, problem) in enumerate(problems):
        adapter, lineage = fake_adapter(tmp_path / f"bad{i}"), {"cursor": {**cursor, **bad}}
        with pytest.raises(ConfigError, match=f"lineage: cursor: {problem}"):
            registry.register("sdar-policy", adapter, eval_report([1] * 10), lineage)


def test_a_run_that_would_train_nothing_new_is_skipped(registry_with_production, tmp_path):
    """A run from the same start adapter (production, resolved to the same version) with the same tasks, seeds and
    settings as the newest registered version's run would train nothing new; another setting, another production
    version or a continued data cursor would."""
    from sdarflow.pipeline_config import load, prepare, stage_config, unchanged_since

    registry = registry_with_production

    def prepared(run_id: str, **overrides):
        settings = {"data_cursor": "fixed", "start_adapter": "production", "registry": str(registry.uri)}
        return load(prepare(make_config(tmp_path, run_id=run_id, **{**settings, **overrides})))

    def registered(pc, folder: str, **lineage) -> None:
        request = stage_config(pc, "register", 0, adapter="a", eval_report="e").request
        lineage = {"run_id": pc.run_id, "request": request, **lineage}
        registry.register("sdar-policy", fake_adapter(tmp_path / folder), eval_report([1] * 10), lineage)

    first = prepared("nightly-1")
    assert unchanged_since(first) == ""  # v3 records no request
    registered(first, "a4")
    assert unchanged_since(prepared("nightly-2")) == (
        "nothing changed since run nightly-1 registered sdar-policy v4: the same start adapter, tasks, seeds and "
        "settings; fix: data_cursor continue (new tasks and seeds), or change a setting or the start adapter"
    )
    assert unchanged_since(prepared("nightly-2", lr=1e-4)) == ""
    assert unchanged_since(prepared("nightly-2", stage_settings={"generate": {"first_task": 8}})) == ""
    cursor = stage_config(first, "register", 0, adapter="a", eval_report="e").cursor
    registered(first, "a5", cursor=cursor)
    assert unchanged_since(prepared("nightly-3", data_cursor="continue")) == ""  # new tasks, next seed
    # the reference library, published into each run's folder, is the same library every time
    reference = {"env": "search-qa", "seed_skills": "reference"}
    registered(prepared("search-1", **reference), "a6")
    assert unchanged_since(prepared("search-2", **reference)).startswith("nothing changed since run search-1")
    registry.promote("sdar-policy", 3, force=True, reason="test")
    assert unchanged_since(prepared("search-2", **reference)) == ""  # production moved on


def test_the_base_evaluation_is_keyed_by_the_base_weights_and_the_settings(tiny_model, tmp_path):
    """One base evaluation per (base weights, evaluation settings), shared by the runs: the same weights at
    another path share it; other weights, other evaluation tasks, another storage do not."""
    import shutil

    from sdarflow.pipeline_config import PipelineConfig, base_eval_config

    def key(**settings) -> str:
        pc = PipelineConfig(**{"storage": str(tmp_path / "s"), "base_model": str(tiny_model), **settings})
        return base_eval_config(pc).output

    first = key(run_id="a")
    assert first.startswith(str(tmp_path / "s" / "cache" / "base-evaluations"))
    assert key(run_id="b", tasks=7) == first
    copy = shutil.copytree(tiny_model, tmp_path / "copy")
    assert key(base_model=str(copy)) == first
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)  # other weights, same shapes
    weights.write_bytes(bytes(data))
    assert key(base_model=str(copy)) != first
    assert key(eval_tasks=5) != first and key(storage=str(tmp_path / "t")) != first


def test_pipeline_config_checks(tmp_path):
    from sdarflow.errors import ConfigError
    from sdarflow.pipeline_config import prepare, stage_config

    with pytest.raises(ConfigError, match=r"tasks \(2\) must be >= shards \(4\)"):
        make_config(tmp_path, tasks=2, shards=4)
    with pytest.raises(ConfigError, match=r"gate: passk_tolerance = 2.0 must be in \[0, 1\]"):
        make_config(tmp_path, gate={"passk_tolerance": 2.0})
    with pytest.raises(ConfigError, match="gate: unknown key"):
        make_config(tmp_path, gate={"min_gian": 0.1})
    with pytest.raises(ConfigError, match="promote_to"):
        make_config(tmp_path, promote_to="prod")
    with pytest.raises(ConfigError, match="lora_rank 0 trains the whole model.*fix: lora_rank 8-64"):
        prepare(make_config(tmp_path, lora_rank=0))  # before any round: register would refuse a model
    with pytest.raises(ConfigError, match="lora_rank 0 trains the whole model"):
        prepare(make_config(tmp_path, stage_settings={"train": {"lora_rank": 0}}))
    # production is promoted by the gated promote task, never by register
    pc = make_config(tmp_path, run_id="r", promote_to="production", registry="reg")
    assert stage_config(pc, "register", 0, adapter="a", eval_report="e").promote_to == ""


def test_a_run_from_a_control_stays_a_control(registry_with_production, tmp_path):
    # a version the solution teacher taught, continued by a new run: the copy carries its teacher into train's
    # lineage, so the new version is refused production as well
    from sdarflow.pipeline_config import load, prepare
    from sdarflow.train.report import teacher_contexts

    registry = registry_with_production
    lineage = {"run_id": "control", "teacher_contexts": ["skills", "solution"]}
    v = registry.register("sdar-policy", fake_adapter(tmp_path / "a4"), eval_report([3] * 10), lineage)
    pc = make_config(tmp_path, registry=str(registry.uri), start_adapter=str(v))
    uri = load(prepare(pc)).start_adapter
    assert storage.read_manifest(uri, "adapter")["teacher_contexts"] == ["skills", "solution"]
    assert teacher_contexts([], uri) == ["skills", "solution"]


def test_start_adapter_resolves_production_into_the_run(registry_with_production, tmp_path):
    from sdarflow.pipeline_config import load, prepare, stage_config
    from sdarflow.stages.common import local_artifact

    registry = registry_with_production
    pc = make_config(tmp_path, registry=str(registry.uri), start_adapter="production")
    uri = load(prepare(pc)).start_adapter
    assert uri == storage.join(pc.storage, "runs", pc.run_id, "start-adapter")
    manifest = storage.read_manifest(uri, "adapter")
    assert (manifest["version"], manifest["resolved_from"]) == (1, "production")
    assert manifest["teacher_contexts"] == ["unknown"]  # v1's lineage does not name its teacher
    folder = local_artifact(uri, "adapter")  # what generate/rescore/train load
    assert sorted(p.name for p in Path(folder).iterdir() if not p.name.startswith("_")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "base_model.json",  # the base fingerprint the stages check it against
    ]
    # round 0 continues from it; later rounds get their previous round's adapter
    assert stage_config(load(prepare(pc)), "train", 0, input=["x"], adapter="").adapter.endswith(
        "start-adapter"
    )
    assert stage_config(pc, "train", 1, input=["x"], adapter="round0").adapter == "round0"


def test_seed_skills_reference_is_the_envs_reference_library_published_into_the_run(tmp_path):
    from sdarflow.errors import ConfigError
    from sdarflow.pipeline_config import load, prepare, stage_config
    from sdarflow.skills.library import SkillLibrary, reference_library

    pc = load(prepare(make_config(tmp_path, env="search-qa", seed_skills="reference")))
    assert pc.seed_skills == storage.join(pc.storage, "runs", pc.run_id, "seed-skills")
    published = storage.read_manifest(pc.seed_skills, "skills")["version"]
    assert published == SkillLibrary.load(reference_library("search-qa")).version
    # round 0 merges into it; later rounds into their previous round's library
    assert stage_config(pc, "extract-skills", 0, input=["x"]).previous == pc.seed_skills
    assert stage_config(pc, "extract-skills", 1, input=["x"], previous="round0").previous == "round0"
    with pytest.raises(ConfigError, match="the SDAR reference has no skill library for textworld-cooking"):
        prepare(make_config(tmp_path, seed_skills="reference"))


def test_start_adapter_without_a_production_version_starts_fresh(tmp_path):
    from sdarflow.pipeline_config import load, prepare

    pc = make_config(tmp_path, start_adapter="production")
    assert load(prepare(pc)).start_adapter == ""
    assert (
        load(prepare(make_config(tmp_path, start_adapter="/some/adapter"))).start_adapter == "/some/adapter"
    )


def test_promote_candidate_reports_a_refusal_without_failing(registry_with_production, tmp_path):
    from sdarflow.kfp_runtime import promote_candidate
    from sdarflow.pipeline_config import prepare

    registry = registry_with_production
    uri = prepare(make_config(tmp_path, registry=str(registry.uri), promote_to="production"))
    version_uri = storage.join(str(registry.uri), "sdar-policy", "versions")
    refused = promote_candidate(uri, f"{version_uri}/2", actor="test")
    assert refused.startswith("refused: gate refused: ") and "test pass@4 vs production v1" in refused
    assert registry.aliases("sdar-policy")["production"] == 1
    assert promote_candidate(uri, f"{version_uri}/3", actor="test").endswith("-> v3 (gate: passed)")
    skipped = prepare(make_config(tmp_path, registry=str(registry.uri), promote_to="staging"))
    assert promote_candidate(skipped, f"{version_uri}/2").startswith("not promoted")


def test_promote_candidate_compares_with_production_evaluated_on_the_runs_tasks(
    registry_with_production, tmp_path
):
    """The run's production evaluation (its own copy of v1, on the run's tasks) is the gate's production reference:
    there v1 does as well as v3 (3 of 4 on every task), so v3, which beats v1's registered report, is refused. An
    evaluation of an adapter that is not a version of the run's registry is an error."""
    from sdarflow.errors import ConfigError
    from sdarflow.evaluate.metrics import REPORT, REPORT_KIND
    from sdarflow.kfp_runtime import promote_candidate
    from sdarflow.pipeline_config import load, prepare, production_eval_config

    registry = registry_with_production
    uri = prepare(make_config(tmp_path, registry=str(registry.uri), promote_to="production"))
    cfg = production_eval_config(load(uri))
    assert storage.read_manifest(cfg.adapter, "adapter")["version"] == 1
    assert cfg.output.endswith("production-evaluation") and (cfg.baseline, cfg.registry) == ("", "")

    def evaluated(adapter: str) -> str:
        folder = tmp_path / "report"
        folder.mkdir(exist_ok=True)
        (folder / REPORT).write_text(json.dumps(eval_report([3] * 10, adapter=adapter)))
        storage.publish_dir(folder, cfg.output, kind=REPORT_KIND, overwrite=True)
        return cfg.output

    version_uri = storage.join(str(registry.uri), "sdar-policy", "versions", "3")
    refused = promote_candidate(uri, version_uri, actor="test", production_evaluation=evaluated(cfg.adapter))
    assert "test pass@1 vs production v1 (same tasks): 0.725 - 0.75 = -0.025" in refused
    made = tmp_path / "made"
    made.mkdir()
    storage.publish_dir(made, str(tmp_path / "other"), kind="adapter")
    with pytest.raises(ConfigError, match="not a version of sdar-policy in"):
        promote_candidate(uri, version_uri, production_evaluation=evaluated(str(tmp_path / "other")))
    assert promote_candidate(uri, version_uri, actor="test").endswith("-> v3 (gate: passed)")
    staging = prepare(make_config(tmp_path, registry=str(registry.uri), promote_to="staging"))
    assert production_eval_config(load(staging)) is None


def test_promote_candidate_reads_the_version_from_the_manifest_not_the_uri(
    registry_with_production, tmp_path
):
    from sdarflow.errors import StorageError
    from sdarflow.kfp_runtime import promote_candidate
    from sdarflow.pipeline_config import prepare

    registry = registry_with_production
    uri = prepare(make_config(tmp_path, registry=str(registry.uri), promote_to="production"))
    made = tmp_path / "made"
    made.mkdir()
    adapter = tmp_path / "adapter"  # a published artifact, but no registry version, whatever its name says
    storage.publish_dir(made, str(adapter / "3"), kind="adapter")
    with pytest.raises(StorageError, match="holds a 'adapter' artifact, expected 'sdarflow-adapter-version'"):
        promote_candidate(uri, str(adapter / "3"), actor="test")
    assert registry.aliases("sdar-policy")["production"] == 1


class _Artifact:
    def __init__(self, path):
        self.path = str(path)


def test_missing_stage_reports_become_placeholders(tmp_path, caplog):
    from sdarflow.kfp_runtime import _write_reports

    made = tmp_path / "made"
    made.mkdir()
    (made / "report.md").write_text("# real report\n")
    out = tmp_path / "out"
    storage.publish_dir(made, str(out), kind="adapter")
    html, md = _Artifact(tmp_path / "a.html"), _Artifact(tmp_path / "a.md")
    _write_reports(html, md, str(out), "train")
    assert "published no report.html" in Path(html.path).read_text()
    assert Path(md.path).read_text() == "# real report\n"
    assert "no report.html" in caplog.text


def test_a_pipeline_task_shares_the_games_it_makes_in_the_storage_cache(tiny_model, tmp_path, monkeypatch):
    """A task on a node with an empty cache generates its TextWorld games and publishes them under
    <storage>/cache/games, where the other tasks and runs find them."""
    from sdarflow.kfp_runtime import run_stage
    from sdarflow.pipeline_config import PipelineConfig, prepare

    monkeypatch.setenv("SDARFLOW_CACHE", str(tmp_path / "empty-node"))
    store = tmp_path / "store"
    pc = PipelineConfig(storage=str(store), base_model=str(tiny_model), tasks=2, group_size=2, max_turns=2)
    run_stage("generate", prepare(pc), 0)
    (games,) = (store / "cache" / "games").iterdir()
    assert sorted(p.name for p in games.iterdir()) == ["1000.json", "1000.z8", "1001.json", "1001.z8"]


def test_base_model_on_s3_is_copied_once(tmp_path, s3_root, monkeypatch):
    import pyarrow.fs as pafs

    from sdarflow.model_cache import local_model

    monkeypatch.setenv("SDARFLOW_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    loc = storage.resolve(f"{s3_root}/models/base")
    pafs.copy_files(
        str(model), loc.path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=loc.fs
    )
    local = Path(local_model(f"{s3_root}/models/base"))
    assert (local / "model.safetensors").read_bytes() == b"weights"
    assert local_model(f"{s3_root}/models/base") == str(local)  # cached
    assert local_model(str(model)) == str(model)  # paths pass through


def test_the_reference_preset_reaches_the_stages_as_the_reference_sets_them(tmp_path):
    from sdarflow.pipeline_config import load, prepare, stage_config
    from sdarflow.sizes import PIPELINE_PRESETS

    load(
        prepare(make_config(tmp_path, run_id="p", **PIPELINE_PRESETS["production"]))
    )  # every stage validates
    pc = load(prepare(make_config(tmp_path, run_id="r", **PIPELINE_PRESETS["reference"])))
    generate, train = stage_config(pc, "generate", 0), stage_config(pc, "train", 0)
    evaluate = stage_config(pc, "evaluate", 0)
    assert (generate.tasks, generate.group_size, generate.max_turns) == (16, 8, 50)
    for rollout in (generate, evaluate):
        assert (rollout.max_new_tokens, rollout.history_turns, rollout.max_turns) == (512, 2, 50)
    assert train.carry_optimizer  # one AdamW for the run, as the reference's
    assert (train.lr, train.weight_decay, train.lora_rank, train.lora_alpha, train.mini_batches) == (
        3e-6,
        0.01,
        64,
        64,
        2,
    )
    # the search family's step: 4 turns with 4 in the prompt, the teacher's prompt cut at 4096 tokens
    pc = load(prepare(make_config(tmp_path, run_id="s", **PIPELINE_PRESETS["reference-search"])))
    generate, rescore = stage_config(pc, "generate", 0), stage_config(pc, "rescore", 0)
    evaluate, train = stage_config(pc, "evaluate", 0), stage_config(pc, "train", 0)
    assert (generate.env, generate.tasks, generate.group_size) == ("search-qa", 128, 8)
    for rollout in (generate, evaluate):
        assert (rollout.max_new_tokens, rollout.history_turns, rollout.max_turns) == (512, 4, 4)
    assert rescore.max_prompt_tokens == 4096 and evaluate.tasks == 128
    # the reference's skills/search, published into the run, is what round 0 merges into
    assert stage_config(pc, "extract-skills", 0, input=["x"]).previous.endswith("runs/s/seed-skills")
    assert train.carry_optimizer and (train.lr, train.weight_decay, train.lora_rank, train.mini_batches) == (
        3e-6,
        0.01,
        64,
        2,
    )


@pytest.mark.parametrize("name", ["demo", "smoke", "gpu", "pretrained"])
def test_every_preset_is_a_valid_pipeline(tmp_path, name):
    from sdarflow.cli import PRESET_NAMES
    from sdarflow.pipeline_config import load, prepare, stage_config
    from sdarflow.sizes import SIZES

    assert set(PRESET_NAMES) == set(SIZES)
    pc = load(prepare(make_config(tmp_path, run_id="r1", **SIZES[name]["pipeline"])))  # validates every stage
    if name != "smoke":
        # RL rounds start on the tasks after the SFT's (the base model's, or the warm start's): none seen in SFT
        sft_tasks = SIZES[name]["model"].tasks if SIZES[name]["model"] else SIZES[name]["warm_start"]["tasks"]
        assert stage_config(pc, "generate", 0, adapter="").first_task == sft_tasks
