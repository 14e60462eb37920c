"""How the read router picks among usable replicas and measures their lag (no database: the
replicas' states are what the health checks would have found)."""

from __future__ import annotations

from typing import Any

from shared.read_routing import ReadRouter, Replica
from shared.repositories.replication import StandbyStatus
from shared.settings import RecallSettings


def router(strategy: str, *states: tuple[bool, float]) -> ReadRouter:
    settings = RecallSettings(DATABASE_REPLICA_STRATEGY=strategy, DATABASE_REPLICA_MAX_LAG=5)
    pool: Any = object()
    replicas = [Replica(i, f"postgresql://standby-{i}/engram", pool, usable=usable, lag_s=lag) for i, (usable, lag) in enumerate(states)]
    return ReadRouter(pool, replicas, settings, redis=None)


def test_round_robin_takes_turns_among_usable_replicas_only() -> None:
    r = router("round_robin", (True, 0.0), (False, 0.0), (True, 0.0))
    firsts = [r._ordered()[0].index for _ in range(4)]
    assert sorted(set(firsts)) == [0, 2]
    assert firsts[0] != firsts[1] and firsts[:2] == firsts[2:]


def test_least_lag_prefers_the_replica_closest_to_the_primary() -> None:
    r = router("least_lag", (True, 2.0), (True, 0.1), (False, 0.0))
    assert [x.index for x in r._ordered()] == [1, 0]


def test_no_usable_replica_means_the_primary() -> None:
    assert router("round_robin", (False, 0.0), (False, 9.0))._ordered() == []


def test_lag_is_measured_against_the_primary_so_an_idle_primary_is_no_lag() -> None:
    r = router("round_robin", (True, 0.0))
    # The primary has not moved for ten minutes and the replica has replayed all of it: lag 0,
    # although its last replayed transaction is ten minutes old.
    r._samples.extend([(0.0, 1000), (300.0, 1000), (600.0, 1000)])
    assert r._lag_from_samples(1000, now=600.0) == 0.0
    # The primary had flushed new WAL by t=590 that the replica has not replayed: 10 s behind.
    moved = router("round_robin", (True, 0.0))
    moved._samples.extend([(0.0, 1000), (300.0, 1000), (590.0, 2000), (600.0, 2000)])
    assert moved._lag_from_samples(1000, now=600.0) == 10.0
    assert moved._lag_from_samples(2000, now=600.0) == 0.0


def test_without_the_primary_the_standby_s_own_figures_decide() -> None:
    caught_up = StandbyStatus(in_recovery=True, replay_lsn=500, receive_lsn=500, replay_age_s=900.0)
    behind = StandbyStatus(in_recovery=True, replay_lsn=400, receive_lsn=500, replay_age_s=12.0)
    assert ReadRouter._lag_from_standby(caught_up) == 0.0
    assert ReadRouter._lag_from_standby(behind) == 12.0
