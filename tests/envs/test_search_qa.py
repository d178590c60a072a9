"""The ``search-qa`` suite: a generated corpus, BM25 search, multi-hop questions with an OOD split."""

from __future__ import annotations

import json

import pytest

from sdarflow.envs import EnvError, get_suite
from sdarflow.envs.search_qa import BM25, QA_SPLITS, Document, SearchQASuite, build_world, documents


@pytest.fixture(scope="module")
def suite() -> SearchQASuite:
    return get_suite("search-qa")


def test_corpus_is_generated_deterministically_with_unique_names() -> None:
    a, b, c = documents(build_world(0)), documents(build_world(0)), documents(build_world(1))
    assert a == b and a != c
    names = [d.title.lower() for d in a]
    assert len(names) == len(set(names))


def test_bm25_ranks_the_named_entity_first(suite) -> None:
    for ent in list(suite.world.values())[::17]:
        assert suite.index.search(ent.name.lower(), 1)[0].doc_id == ent.eid
    assert suite.index.search("qqqq zzzz", 3) == []


def test_bm25_prefers_rarer_terms_and_shorter_documents() -> None:
    docs = [
        Document("a", "a", "apple apple banana"),
        Document("b", "b", "banana cherry"),
        Document("c", "c", "banana " * 20 + "apple"),
    ]
    index = BM25(docs)
    assert [d.doc_id for d in index.search("apple", 3)] == ["a", "c"]
    assert index.search("banana cherry", 1)[0].doc_id == "b"


@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_expert_searches_each_hop_then_answers(suite, split) -> None:
    for task in suite.tasks(split, 30):
        env = suite.make(task)
        env.reset()
        actions, steps = [], []
        while (action := env.expert_action()) is not None:
            assert suite.parse_action(action, True) == (action, True)
            actions.append(action)
            steps.append(env.step(action))
        hops = len(json.loads(task.payload)["chain"]) - 1
        assert steps[-1].won and steps[-1].reward == 1.0, task.task_id
        assert [a.split("[")[0] for a in actions] == ["search"] * hops + ["answer"]


def test_ood_has_more_hops_and_an_unseen_relation(suite) -> None:
    def relations(split):
        return {rel for t in QA_SPLITS[split].templates for rel in t.path}

    assert "mentor" in relations("ood") and "mentor" not in relations("train")
    assert max(len(t.path) for t in QA_SPLITS["ood"].templates) > max(
        len(t.path) for t in QA_SPLITS["train"].templates
    )
    subjects = {
        split: {json.loads(t.payload)["chain"][0] for t in suite.tasks(split)}
        for split in ("train", "test", "ood")
    }
    assert not subjects["train"] & subjects["test"] and not subjects["train"] & subjects["ood"]


def test_answers_compare_exactly_modulo_case_and_spaces(suite) -> None:
    task = suite.tasks("train", 1)[0]
    answer = suite.make(task).answer
    env = suite.make(task)
    env.reset()
    assert env.step(f"answer[  {answer.upper()} ]").won
    env.reset()
    wrong = env.step(f"answer[{answer} x]")
    assert wrong.done and not wrong.won and wrong.reward == 0.0


def test_action_format(suite) -> None:
    assert suite.parse_action("  Search[ Foo   Bar ] ", True) == ("search[foo bar]", True)
    assert suite.parse_action("search[foo]", False)[1] is False
    for bad in ("look", "search[]", "find[x]", "search[a] answer[b]"):
        assert suite.parse_action(bad, True)[1] is False, bad
    env = suite.make(suite.tasks("train", 1)[0])
    env.reset()
    step = env.step("look around")
    assert not step.done and step.info["malformed_calls"] == 1 and "search[query]" in step.observation


def test_truncation_and_bad_requests(suite) -> None:
    short = SearchQASuite(max_turns=1)
    env = short.make(short.tasks("train", 1)[0])
    env.reset()
    step = env.step("search[nothing here]")
    assert step.done and step.info["truncated"] and not step.won
    with pytest.raises(EnvError, match="world_seed=0"):
        SearchQASuite(world_seed=1).make(suite.tasks("train", 1)[0])
    with pytest.raises(EnvError, match="unknown split"):
        suite.tasks("dev", 1)
    with pytest.raises(EnvError, match="top_k"):
        SearchQASuite(top_k=0)


def test_the_solution_and_reference_continuation_name_only_the_splits_tasks():
    suite = SearchQASuite()
    task = suite.tasks("train", n=1, start=5)[0]
    steps = suite.solution(task.task_id, "train")
    assert steps[-1] == suite.reference_continuation(task.task_id) and steps[0].startswith("search[")
    last = suite.tasks("train")[-1].task_id  # one past the split's end is refused, not wrapped to task 0
    beyond = f"search-qa-train-{int(last.rsplit('-', 1)[1]) + 1}"
    for bad in (beyond, "search-qa-train-05", "search-qa-train-+5", "search-qa-train-5²"):
        with pytest.raises(EnvError, match="is not one of the 480 tasks of split 'train'.*fix:"):
            suite.solution(bad, "train")
    with pytest.raises(EnvError, match="fix:"):
        suite.reference_continuation(beyond)
    assert suite.reference_continuation("tool-use-train-5") is None  # not this suite's
