"""Races: compare-and-swap on the alias table, exclusive version claims, concurrent registers and promotions.

Every test runs on a local folder and on moto's S3 server, which enforces conditional writes like S3 does.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from factories import bound

from sdarflow import storage
from sdarflow.registry import Registry, RegistryConflict, cas, store


def test_cas_write_exactly_one_of_two_wins(registry_uri):
    uri = storage.join(registry_uri, "agent", "aliases.json")
    assert cas.read_versioned(uri) == (None, None)

    # Two writers both saw "absent": only the first create succeeds.
    etag = cas.cas_write(uri, b"first", None)
    with pytest.raises(RegistryConflict, match="changed by someone else since it was read; fix: retry"):
        cas.cas_write(uri, b"second", None)

    # Two writers both read the same state (same etag): only the first swap succeeds.
    data, seen = cas.read_versioned(uri)
    assert (data, seen) == (b"first", etag)
    cas.cas_write(uri, b"winner", seen)
    with pytest.raises(RegistryConflict):
        cas.cas_write(uri, b"loser", seen)
    assert cas.read_versioned(uri)[0] == b"winner"


def test_create_exclusive(registry_uri):
    uri = storage.join(registry_uri, "agent", "claims", "1.json")
    assert cas.create_exclusive(uri, b"a") is True
    assert cas.create_exclusive(uri, b"b") is False
    assert storage.read_bytes(uri) == b"a"


def test_concurrent_registers_get_distinct_versions(registry_uri, make_adapter, report, lineage):
    reg = Registry(registry_uri)
    adapters = [make_adapter(seed=i) for i in range(4)]

    def register(i: int) -> int:
        rep = bound(report(0.5, 0.6, 0.4), adapters[i])
        return reg.register("agent", adapters[i], rep, {**lineage, "run_id": f"run-{i}"})

    with ThreadPoolExecutor(max_workers=4) as pool:
        versions = list(pool.map(register, range(4)))
    assert sorted(versions) == [1, 2, 3, 4]
    for i, version in enumerate(versions):
        assert reg.lineage("agent", version)["run_id"] == f"run-{i}"
    assert [row["version"] for row in reg.list_versions("agent")] == [1, 2, 3, 4]


def test_racing_promotions_exactly_one_wins(registry_uri, make_adapter, report, lineage, monkeypatch):
    reg = Registry(registry_uri)
    for test1 in (0.50, 0.55, 0.60):
        reg.register("agent", make_adapter(), report(test1, 0.7, 0.4), lineage)
    reg.promote("agent", 1, force=True, reason="test setup")

    # Both promoters read the alias state before either writes: the worst case CAS must handle.
    barrier = threading.Barrier(2, timeout=20)
    original = store.read_aliases

    def read_then_wait(layout):
        state = original(layout)
        barrier.wait()
        return state

    monkeypatch.setattr(store, "read_aliases", read_then_wait)

    def promote(version: int) -> int | RegistryConflict:
        try:
            # forced: what races is the alias write, whatever the gate would say
            return reg.promote("agent", version, force=True, reason="race")["version"]
        except RegistryConflict as err:
            return err

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(promote, [2, 3]))
    monkeypatch.setattr(store, "read_aliases", original)

    winners = [r for r in results if isinstance(r, int)]
    losers = [r for r in results if isinstance(r, RegistryConflict)]
    assert len(winners) == 1 and len(losers) == 1
    message = str(losers[0])
    assert "someone else changed the aliases of 'agent'" in message and "retry" in message
    assert losers[0].exit_code == 4
    assert reg.aliases("agent") == {"production": winners[0]}
    assert [h["version"] for h in reg.alias_history("agent")] == [1, winners[0]]
    # The loser's retry re-reads the new state and goes through the gate against the winner.
    loser_version = 5 - winners[0]
    reg.promote("agent", loser_version, force=True, reason="retry after conflict")
    assert reg.aliases("agent") == {"production": loser_version}
