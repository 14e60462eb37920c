"""Generation counters that key recall's L1 cache (Redis), so a write invalidates exactly the
cached recalls that could have shown the changed fragments.

Every cached recall is stored under the generations of the keys whose fragments the caller
can read: a tenant reads its own and its groups' keys (`gen:key:<id>`), the master key reads
everything (`gen:master`), and `gen:epoch` is read by all. A write bumps the owner's counter
and the master view, so old cache entries are simply never looked up again (they expire by
TTL). Writers: ingest after commit (remember, amend, forget, link, supersede), maintenance
after a cycle that changed fragments (`all_tenants=True`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shared.domain.principal import Principal

PREFIX = "engram:recall:gen"
EPOCH = f"{PREFIX}:epoch"
MASTER_VIEW = f"{PREFIX}:master"


def key_generation_name(key_id: str) -> str:
    return f"{PREFIX}:key:{key_id}"


def _names_to_bump(owner_key_ids: Iterable[str | None], all_tenants: bool) -> list[str]:
    if all_tenants:
        return [EPOCH]
    names = {MASTER_VIEW}
    for key_id in owner_key_ids:
        if key_id is not None:
            names.add(key_generation_name(key_id))
    return sorted(names)


async def bump_recall_generation(redis: Any, owner_key_ids: Iterable[str | None] = (), *, all_tenants: bool = False) -> None:
    """Invalidate cached recalls that may include fragments owned by these keys (None = the
    master key's own). Call after the write commits, with the owners of the changed rows.
    `redis` is a redis.asyncio client; errors propagate (callers log and go on: the cache
    also re-checks fragments' updated_at on every hit)."""
    pipe = redis.pipeline(transaction=False)
    for name in _names_to_bump(owner_key_ids, all_tenants):
        pipe.incr(name)
    await pipe.execute()


def bump_recall_generation_sync(redis: Any, owner_key_ids: Iterable[str | None] = (), *, all_tenants: bool = False) -> None:
    """The same for a synchronous redis client (Celery tasks)."""
    pipe = redis.pipeline(transaction=False)
    for name in _names_to_bump(owner_key_ids, all_tenants):
        pipe.incr(name)
    pipe.execute()


def generation_names(principal: Principal) -> list[str]:
    """The counters a cached recall of this caller depends on."""
    if principal.is_master:
        return [EPOCH, MASTER_VIEW]
    visible = principal.visible_key_ids or (principal.key_id,)
    return [EPOCH, *(key_generation_name(k) for k in sorted({k for k in visible if k}))]


async def current_generation(redis: Any, principal: Principal) -> str:
    values = await redis.mget(generation_names(principal))
    return ".".join((v.decode() if isinstance(v, bytes) else str(v)) if v is not None else "0" for v in values)
