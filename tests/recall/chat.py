"""A two-person chat for ranking tests: evenings of small talk with the turns under test among
them, stored as LoCoMo turns are (one episode a turn, its date and speaker in the lead)."""

from __future__ import annotations

import random
from typing import Any

from tests.support import call


def small_talk_chat(small_talk: dict[str, list[str]], evenings: int, seed: int, inserted: list[tuple[int, int, str]]) -> list[str]:
    """Six turns an evening, Maria and John in turn, each a seeded pick of their small talk;
    then each (position, evening, "Speaker: text") inserted in order at that position."""
    rng = random.Random(seed)
    turns = []
    for day in range(1, evenings + 1):
        for k in range(6):
            speaker = "John" if k % 2 else "Maria"
            turns.append(f"[7:00 pm on {day} May, 2023] {speaker}: {rng.choice(small_talk[speaker])}")
    for position, day, text in inserted:
        turns.insert(position, f"[7:00 pm on {day} May, 2023] {text}")
    return turns


async def store_chat(session: Any, workspace: str, turns: list[str]) -> dict[str, str]:
    """The turns stored with one batch_remember; their ids by the text after the date lead."""
    reply = await call(session, "batch_remember", {
        "workspace": workspace, "fragments": [{"content": t, "topic": "chat", "type": "episode"} for t in turns],
    })
    return {t.split("] ", 1)[1]: r["id"] for t, r in zip(turns, reply["results"], strict=True)}
