"""task_feedback rows written by reflect's task_effectiveness."""

from __future__ import annotations

import asyncpg

from shared.domain.reflection import TaskEffectiveness


async def insert(conn: asyncpg.Connection, *, key_id: str | None, session_id: str | None, task: TaskEffectiveness) -> int:
    return int(
        await conn.fetchval(
            """
            INSERT INTO task_feedback (key_id, session_id, overall_success, outcome, evaluator, evidence,
                                       unmet_requirements, tool_highlights, tool_pain_points)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id
            """,
            key_id, session_id, task.overall_success, task.outcome, task.evaluator, task.evidence,
            task.unmet_requirements, task.tool_highlights, task.tool_pain_points,
        )
    )
