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


def read_scope(principal: Principal, params: SqlParams, alias: str = "f") -> str:
    """Rows the caller may read. Tenant isolation lives here and nowhere else."""
    if principal.is_master:
        return "TRUE"
    visible = principal.visible_key_ids or (principal.key_id,)
    return f"{alias}.key_id = ANY({params.add(list(visible))}::text[])"


def write_scope(principal: Principal, params: SqlParams, alias: str = "f") -> str:
    """Rows the caller may change: its own (the master key may change any)."""
    if principal.is_master:
        return "TRUE"
    return f"{alias}.key_id = {params.add(principal.key_id)}"


def workspace_scope(workspace: str | None, params: SqlParams, alias: str = "f") -> str:
    """seed: a workspace filter returns that workspace plus global (NULL) fragments."""
    if workspace is None:
        return "TRUE"
    return f"({alias}.workspace = {params.add(workspace)} OR {alias}.workspace IS NULL)"
