"""Every built-in env has a ``valid`` split, disjoint from train, test and ood: settings are chosen on it and
reported on test, so no task may be in both."""

from __future__ import annotations

import pytest

from sdarflow.envs import SPLITS, get_suite
from sdarflow.envs.textworld_cooking import SPLIT_SPECS

OTHERS = [s for s in SPLITS if s != "valid"]


@pytest.mark.parametrize("env", ["tool-use", "search-qa"])
def test_valid_tasks_are_disjoint_from_every_other_split(env):
    suite = get_suite(env)
    valid, others = suite.tasks("valid"), [t for s in OTHERS for t in suite.tasks(s)]  # whole splits
    assert valid and {t.split for t in valid} == {"valid"}
    assert not {t.task_id for t in valid} & {t.task_id for t in others}
    # nor the same question under another id
    assert not {t.payload for t in valid} & {t.payload for t in others}


def test_search_qa_valid_asks_about_people_no_other_split_has():
    suite = get_suite("search-qa")
    people = {s: set(suite._people(s)) for s in SPLITS}
    assert people["valid"] and all(not people["valid"] & people[s] for s in OTHERS)


def test_textworld_valid_games_use_their_own_seeds_and_foods(tmp_path):
    valid = SPLIT_SPECS["valid"]
    assert valid.tw_split == "valid"  # TextWorld's validation foods: neither train's nor test's
    ranges = {
        s: range(SPLIT_SPECS[s].seed_base, SPLIT_SPECS[s].seed_base + SPLIT_SPECS[s].size) for s in OTHERS
    }
    assert all(
        not set(range(valid.seed_base, valid.seed_base + valid.size)) & set(r) for r in ranges.values()
    )
    [task] = get_suite("textworld-cooking", cache_dir=tmp_path).tasks("valid", 1)
    assert task.task_id == f"tw-cooking-valid-{valid.seed_base}" and task.split == "valid"
