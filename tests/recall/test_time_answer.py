"""A question that asks when is answered by the fragment that says when (services/recall/search.py,
TIME_ANSWER_WEIGHT): in a chat the session's date is in every turn's lead, so the turn that
answers "When did Maria go to the pottery class?" is the one saying "last week", while turns
repeating the question's words more often ("pottery class" twice) won on BM25 alone."""

from __future__ import annotations

from services.recall.search import asks_when
from tests.recall.chat import small_talk_chat, store_chat
from tests.support import Stack, call, create_api_key, mcp_session, unique

SMALL_TALK = {
    "John": [
        "Thanks, Maria! Let's keep helping each other and make the world a better place.",
        "Awesome, Maria! Taking care of ourselves is key. Finding balance matters.",
        "Wow, sounds fun! I can't wait to hear more about it.",
        "Thanks for asking, Maria. Work has been busy but good.",
    ],
    "Maria": [
        "Hey John, how's it going? Long time no see!",
        "Thanks, John. It's been a rough week but I'm okay.",
        "Good to hear from you, John! What's new?",
        "Take care, John! Talk soon.",
    ],
}
ANSWER = "Maria: I finally went to the pottery class last week, it was so relaxing."
OTHERS = [
    "Maria: The pottery class is my favourite thing, our pottery class teacher is so patient with everyone.",
    "John: Your pottery class sounds great, Maria! Which pottery class do you take?",
]


def test_which_questions_ask_when() -> None:
    for question in ("When did Maria go to the pottery class?", "when was the party", "How long ago did John move?",
                     "In which year did Maria start pottery?", "What month is the wedding?"):
        assert asks_when(question), question
    # "When" opening a clause, not asking: the answer is what happened, not when.
    for question in ("When Maria was a child, what did she collect?", "Where did Maria take the pottery class?",
                     "What did Maria make last week?", "", None):
        assert not asks_when(question), question


async def test_a_when_question_ranks_the_turn_that_says_when_first(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws = unique()
    # 48 turns of small talk over eight evenings, the three pottery turns among them.
    turns = small_talk_chat(SMALL_TALK, 8, 11, [(12 * (i + 1) + 1, 2 * i + 2, text) for i, text in enumerate([OTHERS[0], ANSWER, OTHERS[1]])])
    async with mcp_session(mcp_url, key) as s:
        ids = await store_chat(s, ws, turns)

        # Without the time bonus the first page opened with OTHERS[0] (BM25: "pottery class" twice).
        page = {"workspace": ws, "pageSize": 3, "tokenBudget": 4000}
        found = await call(s, "recall", {"text": "When did Maria go to the pottery class?", **page})
        assert "when" in found["searchPath"].split(" → "), found["searchPath"]
        assert found["fragments"][0]["id"] == ids[ANSWER], found["fragments"]

        # A question that does not ask when is ranked as before: the turn naming the class twice first.
        where = await call(s, "recall", {"text": "Which pottery class does Maria take?", **page})
        assert "when" not in where["searchPath"].split(" → "), where["searchPath"]
        assert where["fragments"][0]["id"] == ids[OTHERS[0]], where["fragments"]
