"""The default relevance floor (issue 17, item 2): a question about something never stored is
answered `no_results` (the reference's cue to remember) instead of the nearest unrelated
fragments, a related one still finds its fragment, a stored keyword is always found, and an
explicit `threshold` replaces the floor."""

from __future__ import annotations

from tests.support import Stack, call, create_api_key, mcp_session, unique

NOTES = [
    "The billing service retries failed card charges three times, one hour apart.",
    "Melanie painted a sunrise over the lake last summer and hung it in the hallway.",
    "Our staging cluster runs on four ARM nodes in the Frankfurt region.",
    "Jon opened his dance studio after losing his job at the bank.",
]


async def test_unrelated_question_gets_no_results_and_related_one_answers(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws = unique()
    async with mcp_session(mcp_url, key) as s:
        ids = [(await call(s, "remember", {"content": c, "topic": "notes", "type": "fact", "workspace": ws}))["id"] for c in NOTES]

        unrelated = await call(s, "recall", {"text": "Who composed the Goldberg Variations?", "workspace": ws})
        # Before the floor: the nearest of the four notes came back and no hint said "not found".
        assert unrelated["count"] == 0 and unrelated["fragments"] == [], unrelated
        assert "no_results" in {h["signal"] for h in unrelated["_meta"]["hints"]}
        assert "floor" in unrelated["searchPath"]

        related = await call(s, "recall", {"text": "How often are declined payments attempted again?", "workspace": ws})
        assert related["fragments"] and related["fragments"][0]["id"] == ids[0], related
        assert "no_results" not in {h["signal"] for h in related["_meta"]["hints"]}

        # A keyword that is stored is found whatever its embedding's similarity.
        keyword = await call(s, "recall", {"keywords": ["frankfurt"], "workspace": ws})
        assert [f["id"] for f in keyword["fragments"]][:1] == [ids[2]], keyword

        # An explicit threshold replaces the default floor: 0 lets the nearest notes through.
        anything = await call(s, "recall", {"text": "Who composed the Goldberg Variations?", "workspace": ws, "threshold": 0})
        assert anything["count"] > 0 and "floor" not in anything["searchPath"], anything
