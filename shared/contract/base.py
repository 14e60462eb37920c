"""What every tool's arguments share: bounded strings, finite numbers, no NUL characters, and
one way of saying what is wrong with them (-32602 naming the field).

Postgres refuses NUL (U+0000) in text and jsonb, a btree index refuses a row over ~2.7 kB,
and JSON has no NaN or Infinity: each of these used to travel to SQL (or to the internal
HTTP hop) and come back as an internal error. They are refused here, for every tool at once,
so a new tool or field cannot forget them.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from shared.domain.errors import InvalidParams
from shared.domain.fragment import (
    MAX_ID_CHARS,
    MAX_INT64,
    MAX_KEYWORD_CHARS,
    MAX_LABEL_CHARS,
    MAX_TEXT_CHARS,
)

NUL_ERROR = "nul_character"
NONFINITE_ERROR = "non_finite_number"


def _no_nul(value: str) -> str:
    # ToolArgs refuses NUL anywhere already; this keeps the types safe in any other model.
    if "\x00" in value:
        raise PydanticCustomError(NUL_ERROR, "must not contain the NUL character (\\u0000)")
    return value


# A fragment, session, case, agent or job id.
Id = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS), AfterValidator(_no_nul)]
# A short name: topic, workspace, phase, source, entity, a search filter.
Label = Annotated[str, Field(max_length=MAX_LABEL_CHARS), AfterValidator(_no_nul)]
Keyword = Annotated[str, Field(max_length=MAX_KEYWORD_CHARS), AfterValidator(_no_nul)]
Int64 = Annotated[int, Field(le=MAX_INT64)]


def _where(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def unstorable(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first value Postgres or JSON cannot carry, as (error type, its path), or None.
    Walks every nested list and object, keys included: unknown arguments are ignored by the
    models but some reach the database as they came (a search event's filters)."""
    if isinstance(value, str):
        return (NUL_ERROR, path) if "\x00" in value else None
    if isinstance(value, float):
        return None if math.isfinite(value) else (NONFINITE_ERROR, path)
    if isinstance(value, dict):
        for key, item in value.items():
            where = _where(path, key)
            if isinstance(key, str) and "\x00" in key:
                return NUL_ERROR, where
            found = unstorable(item, where)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = unstorable(item, _where(path, i))
            if found:
                return found
    return None


def refusal(found: tuple[str, str]) -> PydanticCustomError:
    kind, path = found
    if kind == NUL_ERROR:
        return PydanticCustomError(NUL_ERROR, "must not contain the NUL character (\\u0000)", {"field": path})
    return PydanticCustomError(NONFINITE_ERROR, "must be a finite number (not NaN or Infinity)", {"field": path})


def check_storable(arguments: Any) -> None:
    """-32602 for arguments no tool could take (the gateway checks before it forwards: NaN
    and Infinity cannot cross the internal JSON hop at all)."""
    found = unstorable(arguments)
    if found:
        raise InvalidParams(f"Invalid params: {found[1] or 'arguments'}: {refusal(found).message()}")


class ToolArgs(BaseModel):
    """Base of every tool's arguments. Unknown arguments are ignored, as the reference does;
    known ones are strict. A string without a limit of its own is capped at MAX_TEXT_CHARS."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, str_max_length=MAX_TEXT_CHARS)

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        found = unstorable(data)
        if found:
            raise refusal(found)
        return data


def problems(exc: ValidationError) -> list[str]:
    """'<field>: <problem>' for each error: the -32602 message of every tool, and one
    batch item's results[i].error."""
    found = []
    for err in exc.errors():
        # A problem ToolArgs' walk found carries its path; any other is where its loc says.
        field = (err.get("ctx") or {}).get("field")
        where = field if field is not None else ".".join(str(p) for p in err["loc"])
        where = where or "arguments"
        found.append(f"{where}: {err['msg']}")
    return found
