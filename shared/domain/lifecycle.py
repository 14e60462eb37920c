"""How a fragment ages: TTL tiers, importance half-lives, activation decay, utility for GC.

The rules, in one place (the consolidation stages write them as SQL with these values):

TTL tiers
- permanent: anchors. Permanent is sticky (forget needs force); only an un-anchored
  fragment that was never set permanent by hand moves between the other three.
- hot: used recently and often -- accessed within HOT_WINDOW and at least HOT_MIN_ACCESS
  times -- or importance >= HOT_MIN_IMPORTANCE.
- cold: not accessed (or created, if never accessed) within COLD_AFTER and importance
  below COLD_MAX_IMPORTANCE. Only cold fragments are ever garbage-collected.
- warm: everything else (the tier a new fragment starts in).

Importance decays by type half-life from `last_decay_at` (or `created_at` the first time):
importance * 0.5 ** (elapsed / half_life). The stage stamps last_decay_at, so running it
twice in a row decays once. Anchors never decay; importance never drops below
IMPORTANCE_FLOOR by decay alone.

Garbage collection deletes a cold, non-anchor, non-permanent fragment whose utility --
importance weighted by use and recency -- is below GC_MAX_UTILITY and that has been idle
longer than GC_GRACE; at most the stage's limit per cycle, lowest utility first.
"""

from __future__ import annotations

from datetime import timedelta

HOT_WINDOW = timedelta(days=3)
HOT_MIN_ACCESS = 3
HOT_MIN_IMPORTANCE = 0.9
COLD_AFTER = timedelta(days=30)
COLD_MAX_IMPORTANCE = 0.4

# Days. Decisions and preferences stay relevant for months; an episode is about one day.
HALF_LIFE_DAYS: dict[str, float] = {
    "preference": 180.0,
    "decision": 120.0,
    "procedure": 120.0,
    "relation": 120.0,
    "fact": 90.0,
    "error": 60.0,
    "episode": 30.0,
}
IMPORTANCE_FLOOR = 0.05
# Below this gap since the last decay, a rerun does nothing (and writes nothing) ...
MIN_DECAY_STEP = timedelta(hours=1)
# ... and a row is rewritten only once its importance would drop by this much (a 0.5 fact
# reaches it after ~5 days): a ~2 KB row with a 384-d vector is rarely updated HOT, and a
# non-HOT update pays an HNSW insert (~2 ms at 100k rows, bench/consolidation_bench.py), so
# at 100k fragments this keeps steady-state decay near 5k rewrites per 6-hour cycle.
MIN_DECAY_DELTA = 0.02

# ema_activation (raised by recall hits) halves each week without use.
ACTIVATION_HALF_LIFE_DAYS = 7.0

GC_GRACE = timedelta(days=60)
GC_MAX_UTILITY = 0.08


def decayed(importance: float, elapsed_days: float, fragment_type: str) -> float:
    half_life = HALF_LIFE_DAYS.get(fragment_type, 90.0)
    return max(IMPORTANCE_FLOOR, importance * 0.5 ** (elapsed_days / half_life))


# utility = importance * (1 + ln(1 + access_count)) * 0.5 ** (idle_days / 90)
UTILITY_SQL = (
    "({a}.importance * (1 + ln(1 + {a}.access_count)) "
    "* power(0.5, extract(epoch FROM now() - coalesce({a}.last_accessed_at, {a}.created_at)) / 86400.0 / 90.0))"
)


def utility_sql(alias: str = "f") -> str:
    return UTILITY_SQL.format(a=alias)


def half_life_case_sql(alias: str = "f") -> str:
    whens = " ".join(f"WHEN '{t}' THEN {d}" for t, d in HALF_LIFE_DAYS.items())
    return f"(CASE {alias}.type {whens} ELSE 90.0 END)"
