"""The demo's view of the KFP local runner's output: per-task plumbing dropped, the stages' lines and each task's
start and status kept, unknown lines passed through."""

from __future__ import annotations

import io

from sdarflow.demo import RunnerOutput

RUNNER = """\
05:40:54.959 - INFO - Executing task \x1b[96m'generate'\x1b[0m
05:40:54.959 - INFO - Streamed logs:

    [KFP Executor 2026-12-01 05:40:55,037 INFO]: Looking for component `generate` in --component_module_path `/tmp/x.py`
    [KFP Executor 2026-12-01 05:40:55,037 INFO]: Loading KFP component "generate" from /tmp/x.py (directory "/tmp")
    [KFP Executor 2026-12-01 05:40:55,038 INFO]: Got executor_input:
    {
        "inputs": {
            "parameterValues": {"rl_round": 0}
        },
        "outputs": {
            "outputFile": "/tmp/executor_output.json"
        }
    }
    [KFP Executor 2026-12-01 05:41:10,000 INFO]: generate hf: 192 episodes | success 0.167
    generate textworld-cooking/train shard 0/1: 100%|##########| 192/192 [00:14<00:00, 13.1ep/s]
    [KFP Executor 2026-12-01 05:41:16,829 INFO]: Wrote executor output file to /tmp/executor_output.json.


05:41:18.336 - INFO - Task \x1b[96m'generate'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m
05:41:18.336 - INFO - Task \x1b[96m'generate'\x1b[0m outputs:
    Output: '/store/runs/kfp/round=0/generate'
    trajectories: Dataset( name='trajectories',
                           metadata={'uri': '/store/runs/kfp/round=0/generate'} )
--------------------------------------------------------------------------------
05:41:18.338 - INFO - Task \x1b[96m'register'\x1b[0m has no outputs
something the runner never printed before
"""


def test_runner_plumbing_is_dropped_and_the_stages_lines_kept():
    out = io.StringIO()
    runner = RunnerOutput(out)
    for i in range(0, len(RUNNER), 37):  # the runner writes in pieces, not whole lines
        runner.write(RUNNER[i : i + 37])
    runner.write("\n")
    assert out.getvalue().splitlines() == [
        "05:40:54.959 - INFO - Executing task \x1b[96m'generate'\x1b[0m",
        "    [KFP Executor 2026-12-01 05:41:10,000 INFO]: generate hf: 192 episodes | success 0.167",
        "    generate textworld-cooking/train shard 0/1: 100%|##########| 192/192 [00:14<00:00, 13.1ep/s]",
        "05:41:18.336 - INFO - Task \x1b[96m'generate'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m",
        "-" * 80,
        "something the runner never printed before",
    ]


def test_the_runners_warnings_about_ignored_settings_are_silenced(recwarn):
    import warnings

    from sdarflow.demo import quiet_runner

    with quiet_runner():
        warnings.warn(
            "Task 'train': settings ['display_name'] have no effect in the current local runner", stacklevel=1
        )
        warnings.warn(
            'You may be attemping to run a task that uses custom or non-Python base image "x"',
            RuntimeWarning,
            stacklevel=1,
        )
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in recwarn] == ["something else"]


def test_a_block_that_never_ends_stops_being_dropped():
    out = io.StringIO()
    runner = RunnerOutput(out)
    runner.write("    [KFP Executor 2026-12-01 05:40:55,038 INFO]: Got executor_input:\n")
    runner.write("".join(f"line {i}\n" for i in range(RunnerOutput.MAX_SKIPPED + 5)))
    kept = out.getvalue().splitlines()
    assert kept and kept[-1] == f"line {RunnerOutput.MAX_SKIPPED + 4}" and len(kept) < 10
