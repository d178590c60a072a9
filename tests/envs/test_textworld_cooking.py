"""Tests of the ``textworld-cooking`` suite on three freshly generated train games (one shared session cache)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sdarflow.envs import EnvError, get_suite, list_envs
from sdarflow.envs.textworld_cooking import (
    SPLIT_SPECS,
    TASK_TYPES,
    TextWorldCookingEnv,
    TextWorldCookingSuite,
    build_game,
    clean_text,
    game_metadata,
    task_type_of,
)

N_GAMES = 3


@pytest.fixture(scope="session")
def suite(tmp_path_factory: pytest.TempPathFactory) -> TextWorldCookingSuite:
    return TextWorldCookingSuite(cache_dir=tmp_path_factory.mktemp("sdarflow-cache"))


@pytest.fixture(scope="session")
def tasks(suite: TextWorldCookingSuite) -> list:
    return suite.tasks("train", N_GAMES)  # 3 games through the 2-worker generation path


def play_expert(env) -> list:
    steps = []
    while (action := env.expert_action()) is not None:
        steps.append(env.step(action))
        if steps[-1].done:
            break
    return steps


def test_registry_finds_suite_and_lists_names(tmp_path: Path) -> None:
    assert "textworld-cooking" in list_envs() and "textworld-cooking-score" in list_envs()
    suite = get_suite("textworld-cooking", cache_dir=tmp_path, max_turns=7)
    assert isinstance(suite, TextWorldCookingSuite) and suite.max_turns == 7


def test_unknown_env_names_available_ones() -> None:
    with pytest.raises(EnvError, match=r"unknown env 'nope'; available: .*textworld-cooking.*fix"):
        get_suite("nope")


def test_unknown_split_names_allowed_ones(suite: TextWorldCookingSuite) -> None:
    with pytest.raises(EnvError, match=r"'dev'.*train, test, valid, ood.*fix"):
        suite.tasks("dev", 1)


def test_tasks_are_deterministic_and_typed(suite: TextWorldCookingSuite, tasks: list) -> None:
    assert [t.task_id for t in tasks] == [f"tw-cooking-train-{1000 + i}" for i in range(N_GAMES)]
    assert all(t.task_type in TASK_TYPES and t.split == "train" for t in tasks)
    assert suite.tasks("train", N_GAMES) == tasks
    assert suite.tasks("train", 0) == []
    assert suite.tasks("train", 2, start=1) == tasks[1:3]  # cached games, no new generation


def test_task_type_from_walkthrough() -> None:
    assert task_type_of(["take x", "prepare meal", "eat meal"]) == "plain"
    assert task_type_of(["take knife", "dice x with knife", "prepare meal"]) == "cut"
    assert task_type_of(["cook x with stove", "prepare meal"]) == "cook"
    assert task_type_of(["chop x with knife", "cook x with oven"]) == "cut+cook"


def test_cache_hit_does_not_regenerate(suite: TextWorldCookingSuite, tasks: list) -> None:
    before = [Path(t.payload).stat().st_mtime_ns for t in tasks]
    again = suite.tasks("train", N_GAMES)
    assert [Path(t.payload).stat().st_mtime_ns for t in again] == before
    game_dir = Path(tasks[0].payload).parent
    assert sorted(p.name for p in game_dir.iterdir()) == sorted(
        f"{1000 + i}{ext}" for i in range(N_GAMES) for ext in (".json", ".z8")
    )  # no temp dirs or Inform 7 sources left behind


def test_machines_share_their_games_through_storage(tmp_path: Path, s3_root: str, caplog) -> None:
    """A machine that generates games publishes them (S3 here, moto); another with an empty disk copies them
    instead of generating; a shared store that cannot be written or read is a warning, and the games are made."""
    from sdarflow import storage

    maker = TextWorldCookingSuite(cache_dir=tmp_path / "node-a", workers=1, shared=s3_root)
    made = maker.tasks("test", 2)
    shared = storage.join(s3_root, "games", maker.spec("test").settings_hash())
    assert storage.children(shared) == ["2000.json", "2000.z8", "2001.json", "2001.z8"]

    with caplog.at_level("INFO"):
        fetched = TextWorldCookingSuite(cache_dir=tmp_path / "node-b", workers=1, shared=s3_root).tasks(
            "test", 2
        )
    assert "tw-cooking games: 2 from" in caplog.text and "generated tw-cooking game" not in caplog.text
    assert [Path(t.payload).read_bytes() for t in fetched] == [Path(t.payload).read_bytes() for t in made]
    assert [t.task_type for t in fetched] == [t.task_type for t in made]
    assert not list((tmp_path / "node-b").rglob(".*.tmp"))  # every file was renamed into place

    caplog.clear()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with caplog.at_level("INFO"):
        alone = TextWorldCookingSuite(cache_dir=tmp_path / "node-c", workers=1, shared=str(blocked)).tasks(
            "test", 1
        )
    assert "cannot share them" in caplog.text and "generated tw-cooking game" in caplog.text
    assert Path(alone[0].payload).is_file()


def test_same_seed_same_game_different_seeds_different_recipes(tasks: list) -> None:
    metas = [game_metadata(t.payload) for t in tasks]
    rebuilt = build_game(SPLIT_SPECS["train"], 1000).metadata  # regenerated in memory, not from the cache
    assert rebuilt["walkthrough"] == metas[0]["walkthrough"] and rebuilt["recipe"] == metas[0]["recipe"]
    assert len({m["recipe"] for m in metas}) > 1


def test_reset_shows_recipe_and_clean_observation(suite: TextWorldCookingSuite, tasks: list) -> None:
    env = suite.make(tasks[0])
    reset = env.reset()
    ingredient = game_metadata(tasks[0].payload)["ingredients"][0][0]
    assert "Ingredients:" in reset.instruction and ingredient in reset.instruction
    assert "Directions:" in reset.instruction and "prepare meal" in reset.instruction
    assert "-= Kitchen =-" in reset.observation
    assert "$$" not in reset.observation and "\n\n" not in reset.observation and ">" not in reset.observation
    assert env.admissible_commands() and env.expert_action() in env.admissible_commands()
    env.close()
    env.close()


@pytest.mark.parametrize("index", range(N_GAMES))
def test_expert_walkthrough_wins(suite: TextWorldCookingSuite, tasks: list, index: int) -> None:
    env = suite.make(tasks[index])
    env.reset()
    steps = play_expert(env)
    assert steps[-1].done and steps[-1].won and steps[-1].reward == 1.0
    assert all(s.reward == 0.0 and not s.done for s in steps[:-1])
    assert env.expert_action() is None
    with pytest.raises(EnvError, match="ended"):
        env.step("look")
    env.reset()  # a second episode on the same env restarts the game
    assert play_expert(env)[-1].won
    env.close()


def test_score_reward_credits_each_recipe_step_and_sums_to_one_on_a_win(
    suite: TextWorldCookingSuite, tasks: list
) -> None:
    scored = get_suite("textworld-cooking-score", cache_dir=suite.cache_dir)
    for task in tasks:
        env = scored.make(task)
        env.reset()
        steps = play_expert(env)
        points = steps[-1].info["max_score"]
        assert steps[-1].won and sum(s.reward for s in steps) == pytest.approx(1.0)
        # TextWorld gives one point per recipe step: each turn earns 1/max_score or nothing
        assert {s.reward for s in steps} <= {0.0, 1 / points} and sum(s.reward > 0 for s in steps) == points
        env.close()
    # a failed episode earns the share of the recipe it got through; success is still the win
    first_point = next(i for i, s in enumerate(steps) if s.reward > 0)
    short = type(scored)(cache_dir=suite.cache_dir, max_turns=first_point + 2)
    env = short.make(tasks[-1])
    env.reset()
    played = [env.step(env.expert_action()) for _ in range(first_point + 1)] + [env.step("look")]
    assert played[-1].done and played[-1].info["truncated"] and not any(s.won for s in played)
    assert sum(s.reward for s in played) == pytest.approx(1 / points)
    env.close()
    with pytest.raises(EnvError, match="unknown reward 'Score'; fix: win or score"):
        TextWorldCookingEnv(tasks[0], 5, reward="Score")


def test_nonsense_action_and_truncation(tmp_path: Path, suite: TextWorldCookingSuite, tasks: list) -> None:
    short = TextWorldCookingSuite(cache_dir=suite.cache_dir, max_turns=3)
    env = short.make(tasks[0])
    env.reset()
    expert = env.expert_action()
    first = env.step("xyzzy\nexamine cookbook")  # a newline must not smuggle in a second command
    assert first.reward == 0.0 and not first.done and first.observation
    assert "Ingredients" not in first.observation and env.expert_action() == expert
    assert not env.step("").done
    last = env.step("look")
    assert last.done and not last.won and last.reward == 0.0 and last.info["truncated"]
    env.close()


def test_clean_text_drops_banner_prompt_and_restart_question() -> None:
    raw = (
        "\n\n  ________  __\n |  \\$$$$$$\\\n\nWelcome!\n\n-= Kitchen =-\nA room.\n\n\n\n"
        ">     -= Kitchen =-0/1\nYou burned it!\n\n  *** You lost! ***\n\nYou scored 2.\nWould you like to"
    )
    assert clean_text(raw, drop="Welcome!") == "-= Kitchen =-\nA room.\nYou burned it!\n*** You lost! ***"


def test_room_descriptions_keep_the_sentences_that_name_something() -> None:
    raw = (
        "-= Kitchen =-\nYou are in a kitchen. A standard one.\n\nYou see a fridge. What a waste of a day! On the "
        "counter you see a red apple.\n\nThere is an exit to the east.\n>  -= Kitchen =-0/1\n"
        "You take the red apple from the counter.\n\nYour score has just gone up by one point."
    )
    entities = ["kitchen", "fridge", "counter", "red apple", "east"]
    assert clean_text(raw, entities=entities) == (
        "-= Kitchen =-\nYou are in a kitchen.\nYou see a fridge. On the counter you see a red apple.\n"
        "There is an exit to the east.\n"
        # after the prompt, the next command's feedback is kept whole
        "You take the red apple from the counter.\nYour score has just gone up by one point."
    )


def test_bad_requests_raise_env_error(suite: TextWorldCookingSuite) -> None:
    with pytest.raises(EnvError, match="n=-1"):
        suite.tasks("train", -1)
    with pytest.raises(EnvError, match="max_turns"):
        TextWorldCookingSuite(max_turns=0)


def test_overlapping_seed_ranges_rejected(tmp_path: Path) -> None:
    splits = {"train": SPLIT_SPECS["train"], "test": dataclasses.replace(SPLIT_SPECS["test"], seed_base=1500)}
    with pytest.raises(EnvError, match="'train' and 'test' overlap"):
        TextWorldCookingSuite(cache_dir=tmp_path, splits=splits)


def test_a_rollout_env_runs_without_the_state_tracker_and_starts_it_only_when_asked(suite, tasks) -> None:
    guide = suite.make(tasks[0])
    guide.reset()
    walkthrough = [s.observation for s in play_expert(guide)]  # a tracked env: the expert's observations
    expert_env = suite.make(tasks[0])
    expert_env.reset()
    commands = []
    while (action := expert_env.expert_action()) is not None:
        commands.append(action)
        expert_env.step(action)
    guide.close()
    expert_env.close()

    env = suite.make(tasks[0])  # a policy's env: never asks for expert or admissible commands
    env.reset()
    assert not env._tracking
    steps = [env.step(c) for c in commands]
    assert [s.observation for s in steps] == walkthrough  # won/lost/score need no tracker
    assert steps[-1].won and steps[-1].done and not env._tracking

    midway = suite.make(tasks[0])  # asked mid-episode: the tracker starts, replays, and agrees
    midway.reset()
    for c in commands[:2]:
        midway.step(c)
    assert midway.expert_action() == commands[2] and midway._tracking
    assert midway.step(commands[2]).observation == walkthrough[2]
    midway.close()
    env.close()


def test_failed_game_generation_is_one_line_with_the_fix(tmp_path: Path) -> None:
    from sdarflow.envs.textworld_cooking import _generate_in_subprocess

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(
        EnvError, match=r"generating tw-cooking games \[1000\] failed \(exit 1\): .*; fix: "
    ) as err:
        _generate_in_subprocess(SPLIT_SPECS["train"], [1000], blocked / "games")
    assert "\n" not in str(err.value)
