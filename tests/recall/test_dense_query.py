"""The vector layer's query without the words the whole scope shares (services/recall/search.py,
DENSE_STOP_SHARE): in a two-person chat every turn's lead names its speaker and many replies
name the other, so a question naming a speaker was embedded close to any of that speaker's
small talk; left out of the embedded text (BM25 and the label field keep it), the turn that
answers comes first. The relevance floor still judges the whole question."""

from __future__ import annotations

from tests.recall.chat import small_talk_chat, store_chat
from tests.support import Stack, call, create_api_key, mcp_session, unique

SMALL_TALK = {
    "John": [
        "Thanks, Maria! Let's keep helping each other and make the world a better place.",
        "Yeah, I remember that! It was cool to see how our actions can make a big impact.",
        "Awesome, Maria! Taking care of ourselves is key. Finding balance matters.",
        "I totally agree, Maria! Talk to you soon!",
        "Wow, sounds fun! I can't wait to hear more about it.",
        "Haha, that's great news, Maria. Keep it up!",
        "Thanks for asking, Maria. Work has been busy but good.",
        "That means a lot, Maria. You're a great friend.",
    ],
    "Maria": [
        "Hey John, how's it going? Long time no see!",
        "That's amazing, John! I'm so happy for you.",
        "Thanks, John. It's been a rough week but I'm okay.",
        "You're doing great, John. Keep it up!",
        "Good to hear from you, John! What's new?",
        "I agree, John. Friends like you make it easier.",
        "Take care, John! Talk soon.",
        "John, you're such an inspiration to me.",
    ],
}
FACTS = [
    "Maria: I went to the farmers market on Saturday and bought fresh peaches.",
    "Maria: My cat knocked over a plant this morning, what a mess.",
    "John: I finally fixed the leaking kitchen sink myself.",
]


async def test_a_speaker_name_everywhere_does_not_steer_the_vector_layer(stack: Stack, mcp_url: str) -> None:
    key, _ = await create_api_key(stack.database_url)
    ws = unique()
    # 60 turns of small talk over ten evenings, the three facts among them (63 turns).
    turns = small_talk_chat(SMALL_TALK, 10, 7, [(6 * (i + 2) + 1, i + 2, fact) for i, fact in enumerate(FACTS)])
    async with mcp_session(mcp_url, key) as s:
        ids = await store_chat(s, ws, turns)

        # Embedded whole, both questions came closest to Maria's small talk ("Take care, John!
        # Talk soon." and "Good to hear from you, John! What's new?" first).
        for question, fact in (("What pet does Maria have?", FACTS[1]), ("What fruit did Maria buy?", FACTS[0])):
            found = await call(s, "recall", {"text": question, "workspace": ws, "pageSize": 3})
            assert "dense:-1" in found["searchPath"], found["searchPath"]
            assert found["fragments"][0]["id"] == ids[fact], (question, found["fragments"])

        # A question with no word common to the scope is embedded as it is.
        plain = await call(s, "recall", {"text": "Who fixed the kitchen sink?", "workspace": ws, "pageSize": 3})
        assert "dense" not in plain["searchPath"]
        assert plain["fragments"][0]["id"] == ids[FACTS[2]]

        # The floor still judges the whole question: never stored, it is still "not found".
        never = await call(s, "recall", {"text": "Who composed the Goldberg Variations for Maria?", "workspace": ws})
        assert never["fragments"] == [] and "floor" in never["searchPath"], never
