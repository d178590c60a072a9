"""Envs in a worker process: two lanes take turns (one generates while the other's env steps run), with the same
episodes, rows and failure handling as envs in this process."""

from __future__ import annotations

import pytest
from rollout_fakes import FakeSuite, run

from sdarflow.envs import EnvError
from sdarflow.rollout.envhost import LocalEnvs, ProcessEnvs, in_worker, open_envs


def run_lanes(suite, env_process: bool, engine=None):
    return run(suite, engine, max_turns=6, env_process=env_process)


def test_two_lanes_in_a_worker_give_the_same_rows_as_one_lane_here() -> None:
    here, one_lane = run_lanes(FakeSuite(goal=4), env_process=False)
    there, two_lanes = run_lanes(FakeSuite(goal=4), env_process=True)
    assert there.rows == here.rows
    assert one_lane.calls == [6, 6, 6, 6] and two_lanes.calls == [3, 3] * 4  # each lane its own engine call
    assert there.metrics()["rollout/env_steps"] == here.metrics()["rollout/env_steps"] == 24


def test_env_failures_in_the_worker_stay_in_their_episode() -> None:
    suite = FakeSuite(bad={1: {"fail_on": 2}, 2: {"fail_reset": True}})
    result, _ = run_lanes(suite, env_process=True)
    errors = {e.task.task_id: e.error for e in result.episodes}
    assert errors["fake-0"] is None and "RuntimeError: simulator crashed" in errors["fake-1"]
    assert errors["fake-2"].startswith("reset: OSError")
    assert suite.envs == []  # the envs lived in the worker
    assert result.metrics()["rollout/env_errors"] == 4


def test_a_suite_that_cannot_build_its_envs_fails_in_one_line() -> None:
    suite = FakeSuite(bad={0: {"no_such_setting": 1}})
    with pytest.raises(EnvError, match=r"env worker: TypeError: .*no_such_setting"):
        run_lanes(suite, env_process=True)


def test_a_suite_that_cannot_go_to_a_worker_runs_here() -> None:
    suite = FakeSuite()
    suite.hook = lambda: None  # not picklable
    envs = open_envs(suite, suite.tasks("train", 2), 1.0, 1, in_process=False)
    assert isinstance(envs, LocalEnvs) and len(suite.envs) == 2
    picklable = FakeSuite()
    envs = open_envs(picklable, picklable.tasks("train", 2), 1.0, 1, in_process=False)
    try:
        assert isinstance(envs, ProcessEnvs) and envs.max_turns == [8, 8]
    finally:
        envs.shutdown()


def test_auto_puts_envs_in_a_worker_only_beside_a_gpu() -> None:
    assert in_worker("auto", "cuda:0") and in_worker("process", "cpu")
    assert not in_worker("auto", "cpu") and not in_worker("local", "cuda")
