"""Who is calling, and the one place that turns that into SQL tenant filters."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Principal:
    """The authenticated caller. key_id None is the master key (sees every tenant)."""

    key_id: str | None
    key_name: str | None = None
    # Keys whose fragments this caller may read: itself plus its groups' members.
    visible_key_ids: tuple[str, ...] = ()
    permissions: tuple[str, ...] | None = None
    default_workspace: str | None = None
    allowed_workspaces: tuple[str, ...] | None = None
    default_mode: str | None = None
    fragment_limit: int | None = None
    daily_limit: int | None = None
    symbolic_hard_gate: bool = False

    @property
    def is_master(self) -> bool:
        return self.key_id is None

    @property
    def reads(self) -> TenantScope:
        """Rows the caller may read: its own and its groups' members' (the master key: all)."""
        if self.is_master:
            return TenantScope(everyone=True)
        return TenantScope(key_ids=tuple(self.visible_key_ids or (self.key_id,)))

    @property
    def writes(self) -> TenantScope:
        """Rows the caller may change: its own (the master key may change any)."""
        return TenantScope(everyone=True) if self.is_master else TenantScope.key(self.key_id)

    @property
    def owns(self) -> TenantScope:
        """Rows the caller stored: the master key's own are those without a key."""
        return TenantScope.key(self.key_id)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Principal:
        data = dict(data)
        for name in ("visible_key_ids", "permissions", "allowed_workspaces"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        return cls(**data)

    @classmethod
    def master(cls) -> Principal:
        return cls(key_id=None, key_name="master")


@dataclass
class SqlParams:
    """Positional parameters for asyncpg, appended as clauses are written."""

    values: list[Any] = field(default_factory=list)

    def add(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


@dataclass(frozen=True)
class TenantScope:
    """Whose rows: every tenant's (everyone), or exactly those of `key_ids`, where None is
    the master key's own rows (key_id IS NULL). Principal and maintenance's Tenant each
    say theirs; scope_clause turns it into SQL."""

    everyone: bool = False
    key_ids: tuple[str | None, ...] = ()

    @classmethod
    def key(cls, key_id: str | None) -> TenantScope:
        """One tenant: that key's rows, or the master key's own (None)."""
        return cls(key_ids=(key_id,))


def scope_clause(scope: TenantScope, params: SqlParams, alias: str | None = "f") -> str:
    """The WHERE clause of a tenant scope over `alias`.key_id (bare key_id without an alias).
    Tenant isolation is written here and nowhere else (STYLE 5)."""
    column = f"{alias}.key_id" if alias else "key_id"
    if scope.everyone:
        return "TRUE"
    keys = [k for k in scope.key_ids if k is not None]
    parts = [f"{column} IS NULL"] if None in scope.key_ids else []
    if len(keys) == 1:
        parts.append(f"{column} = {params.add(keys[0])}")
    elif keys:
        parts.append(f"{column} = ANY({params.add(keys)}::text[])")
    if not parts:
        return "FALSE"
    return parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"


def scope_ranges(scope: TenantScope, params: SqlParams, alias: str = "f") -> list[str]:
    """scope_clause as disjoint clauses whose OR is the same scope, each one range of an
    index led by key_id (an OR of ranges is a bitmap scan, which reads the heap)."""
    return [clause for clause, _ in key_ranges(scope, params, alias)]


def key_ranges(scope: TenantScope, params: SqlParams, alias: str = "f") -> list[tuple[str, bool]]:
    """scope_ranges' clauses, each with whether it holds one key_id (one key, or the rows
    without a key): in an index led by key_id such a range is in the order of the next
    columns. Every tenant is the rows without a key plus every key's, as one array of
    api_keys' ids: the tables ranged this way reference api_keys, so no other key_id exists."""
    column = f"{alias}.key_id"
    if scope.everyone:
        every_key = "ARRAY(SELECT k.id FROM api_keys k)"
        return [(f"{column} IS NULL", True), (f"{column} = ANY({every_key})", False)]
    keys = [k for k in scope.key_ids if k is not None]
    ranges = [(f"{column} = ANY({params.add(keys)}::text[])", len(keys) == 1)] if keys else []
    if None in scope.key_ids:
        ranges.append((f"{column} IS NULL", True))
    return ranges


def same_tenant(a: str, b: str) -> str:
    """Rows `a` and `b` belong to one tenant: what every pairing of two rows (duplicates,
    contradictions, links) requires, so even an all-tenant run never pairs two keys' rows."""
    return f"{a}.key_id IS NOT DISTINCT FROM {b}.key_id"


def workspace_scope(workspace: str | None, params: SqlParams, alias: str = "f") -> str:
    """seed: a workspace filter returns that workspace plus global (NULL) fragments."""
    if workspace is None:
        return "TRUE"
    return f"({alias}.workspace = {params.add(workspace)} OR {alias}.workspace IS NULL)"


def workspace_ranges(workspace: str | None, params: SqlParams, alias: str = "f") -> list[str]:
    """workspace_scope as disjoint clauses (the workspace, then the global rows)."""
    if workspace is None:
        return ["TRUE"]
    return [f"{alias}.workspace = {params.add(workspace)}", f"{alias}.workspace IS NULL"]


def scope_workspace_ranges(scope: TenantScope, workspace: str | None, params: SqlParams, alias: str = "f") -> list[str]:
    """scope_clause AND workspace_scope as disjoint clauses, each one range of an index led
    by (key_id, workspace): scope_ranges x workspace_ranges. Empty when the scope is empty."""
    return [
        f"{tenant} AND {ws}"
        for tenant in scope_ranges(scope, params, alias)
        for ws in workspace_ranges(workspace, params, alias)
    ]
