"""Property-based: random manifests, skill mappings, stage configs and eval reports fed to the readers. Each either
reads or refuses with an sdarflow error on one line (what the CLI prints, exit code 2); none raises anything else,
and none writes outside its output folder. Derandomized, so every run tries the same inputs."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_schema_storage import write

from sdarflow import storage
from sdarflow.errors import SdarflowError
from sdarflow.registry.gate import check_gate
from sdarflow.registry.intake import validate_report
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.skills.library import MAPPING, SkillLibrary
from sdarflow.stages.generate import GenerateConfig
from sdarflow.stages.train import TrainConfig

SETTINGS = settings(
    derandomize=True,
    database=None,
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

# Path-like strings an attacker would try, mixed with ordinary names.
PATHS = st.sampled_from(
    [
        "part-00000.parquet",
        "../secret.txt",
        "/etc/passwd",
        "a/../../x",
        "C:/x",
        "",
        ".",
        "x\\..\\y",
        "ok/f.md",
    ]
) | st.text(max_size=12)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | PATHS
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | PATHS, inner, max_size=4)
    ),
    max_leaves=12,
)


def _one_line_refusal(err: SdarflowError) -> None:
    assert "\n" not in str(err) and str(err)


def _fresh(root: Path) -> Path:
    folder = root / uuid.uuid4().hex[:8]
    folder.mkdir()
    return folder


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.fixture(scope="module")
def arena(tmp_path_factory) -> Path:
    """A folder with a published dataset next to a secret file that no reader may touch."""
    root = tmp_path_factory.mktemp("arena")
    (root / "secret.txt").write_text("secret")
    write(str(root / "dataset"))
    return root


manifest_entries = st.fixed_dictionaries(
    {"path": PATHS},
    optional={"rows": SCALARS, "bytes": SCALARS, "sha256": SCALARS | st.just("0" * 64)},
)
manifests = (
    st.fixed_dictionaries(
        {"kind": st.sampled_from(["trajectories", "adapter", "x"]) | SCALARS},
        optional={
            "files": st.lists(manifest_entries, max_size=3) | JSON,
            "rows": SCALARS,
            "schema_fingerprint": SCALARS,
        },
    )
    | JSON
)


@SETTINGS
@given(manifest=manifests)
def test_random_manifests_read_or_refuse(arena, manifest):
    folder = _fresh(arena)
    (folder / storage.MANIFEST).write_text(json.dumps(manifest))
    before = _tree(arena)
    for read in (
        lambda: storage.read_table(str(folder), kind="trajectories", schema=TRAJECTORY_SCHEMA),
        lambda: storage.fetch_dir(str(folder), kind="adapter", dest=folder / "fetched"),
    ):
        try:
            read()
        except SdarflowError as err:
            _one_line_refusal(err)
    written = _tree(arena) - before
    assert all(p.startswith(f"{folder.name}/fetched") for p in written), written
    assert (arena / "secret.txt").read_text() == "secret"


mappings = (
    st.fixed_dictionaries(
        {},
        optional={
            "skill_files": st.dictionaries(st.text(max_size=8), PATHS, max_size=3) | JSON,
            "task_to_skill": JSON,
            "task_keywords": JSON,
            "evidence": JSON,
        },
    )
    | JSON
)


@SETTINGS
@given(mapping=mappings, save=st.booleans())
def test_random_skill_mappings_load_or_refuse(arena, mapping, save):
    folder = _fresh(arena)
    (folder / "general_skills.md").write_text("- read the cookbook\n")
    (folder / MAPPING).write_text(json.dumps(mapping))
    before = _tree(arena)
    try:
        lib = SkillLibrary.load(folder)
        if save:
            lib.save(folder / "saved")
    except SdarflowError as err:
        _one_line_refusal(err)
    assert all(p.startswith(f"{folder.name}/saved") for p in _tree(arena) - before)
    assert (arena / "secret.txt").read_text() == "secret"


config_values = st.dictionaries(
    st.sampled_from(
        [
            "lr",
            "epochs",
            "mini_batches",
            "max_grad_norm",
            "micro_batch_tokens",
            "method",
            "tasks",
            "group_size",
            "temperature",
            "top_p",
            "max_turns",
            "batch_size",
            "sdar_coef",
            "nope",
        ]
    )  # fmt: skip
    | st.integers(),
    SCALARS,
    max_size=4,
)


@SETTINGS
@given(values=config_values)
def test_random_configs_construct_or_refuse(values):
    for cls in (TrainConfig, GenerateConfig):
        try:
            cfg = cls.from_dict(
                {k: v for k, v in values.items() if k in cls.__dataclass_fields__ or k == "nope"}
            )
        except SdarflowError as err:
            _one_line_refusal(err)
            continue
        for name in ("lr", "max_grad_norm", "temperature", "top_p", "sdar_coef"):
            value = getattr(cfg, name, 0.0)
            assert math.isfinite(value) and value >= 0


probabilities = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2, 2) | SCALARS
reports = (
    st.fixed_dictionaries(
        {
            "splits": st.dictionaries(
                st.sampled_from(["test", "ood"]) | st.text(max_size=4),
                st.fixed_dictionaries(
                    {
                        "pass_at_k": st.dictionaries(
                            st.sampled_from(["1", "2", "4", "x", "0"]), probabilities, max_size=3
                        )
                    },
                    optional={"ci95": JSON, "n_tasks": SCALARS, "samples_per_task": SCALARS},
                )
                | JSON,
                max_size=2,
            )
        }
    )
    | JSON
)


@SETTINGS
@given(report=reports)
def test_random_reports_never_pass_the_gate_unless_valid(report):
    try:
        validate_report(report, "random")
    except SdarflowError as err:
        _one_line_refusal(err)
    production = {"splits": {s: {"pass_at_k": {"1": 0.0, "2": 0.0, "4": 0.0}} for s in ("test", "ood")}}
    failures = check_gate(report if isinstance(report, dict) else {}, production)
    if not failures:  # a candidate the gate lets through holds probabilities in both splits
        for split in ("test", "ood"):
            values = report["splits"][split]["pass_at_k"].values()
            assert all(isinstance(v, int | float) and math.isfinite(v) and 0 <= v <= 1 for v in values)
