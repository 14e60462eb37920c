"""The secret rules' anchors (shared/domain/secret_rules.py): a rule is skipped only when the
text lacks what every match of it contains, so screening with the anchors finds exactly what
running every rule finds; and conversation prose runs no rule at all."""

from __future__ import annotations

import re
import sys

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared.domain.secret_rules import _ANCHOR_FOLDED, _ANCHOR_WORDS, _NAMES, _SLOT_ANCHORS, Anchored
from shared.domain.secrets import find_secrets, redact, screen
from tests.ingest.secret_corpus import PROSE, SECRETS

# Characters re.IGNORECASE treats as another letter: the anchors must see them as it does.
_CASE_TWINS = {"s": "\u017f", "i": "\u0131", "k": "\u212a", "I": "\u0130"}


def _twinned(text: str, draw_bits: list[bool]) -> str:
    """Some of the text's letters swapped for their re.IGNORECASE twins or the other case."""
    out = []
    for ch, flip in zip(text, draw_bits + [False] * len(text), strict=False):
        if flip:
            ch = _CASE_TWINS.get(ch, ch.swapcase())
        out.append(ch)
    return "".join(out)


_TOKEN = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef0123456789_-+/=.", min_size=1, max_size=70)
_PIECE = st.one_of(
    st.sampled_from([text for text, _ in SECRETS]),
    st.sampled_from(PROSE),
    st.sampled_from(sorted(_ANCHOR_WORDS | _ANCHOR_FOLDED)),
    st.sampled_from(["password", "api_key", "DB_PASS", "token", "pw", "secret_access_key", "contraseña", "비밀번호",
                     "Bearer ", "Authorization: Basic ", "machine h login u password ", "curl -u a:", "mysql -p",
                     "https://u:", "@host", "-----BEGIN RSA PRIVATE KEY-----", "eyJhbGciOiJIUzI1NiJ9."]),
    _TOKEN,
    st.sampled_from([" ", "=", ": ", ":", "\n", '"', "'", "://", "@", ".", "-", "_", "/"]),
    st.text(max_size=12),
)


@st.composite
def credential_like_texts(draw: st.DrawFn) -> str:
    text = "".join(draw(st.lists(_PIECE, min_size=1, max_size=8)))
    return _twinned(text, draw(st.lists(st.booleans(), max_size=len(text))))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(credential_like_texts())
@example("BEARER abcdefghij0123456789xyz")
@example("token=Hunter2x9")
@example("\u0130\u017fs bearer".upper() + " Be\u0101rer")
@example("authorızation: basic YWRtaW46cGFzc3dvcmQ=")
@example('Aws secret key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"')
@example("cl_pw abcdefghijklmnopqrstuvwx")  # Cloudant's 24 letters: the shortest long run a rule needs
def test_anchored_screening_finds_what_every_rule_finds(text: str) -> None:
    assert find_secrets(text) == find_secrets(text, every_rule=True)


def test_the_shortest_long_run_still_runs_its_rule() -> None:
    assert [f.kind for f in find_secrets("cl_pw abcdefghijklmnopqrstuvwx")] == ["cloudant_credentials"]


def test_the_whole_corpus_is_found_alike() -> None:
    for text in [t for t, _ in SECRETS] + PROSE:
        assert find_secrets(text) == find_secrets(text, every_rule=True), text


def test_ignorecase_twins_of_ascii_letters_are_all_folded() -> None:
    # Every non-ASCII character Python's re.IGNORECASE takes for an ASCII letter: an anchor
    # looked for in lower case must still be found when the text spells it with one.
    letter = re.compile("[a-z]", re.I)
    twins = {chr(c) for c in range(0x80, sys.maxunicode + 1) if letter.fullmatch(chr(c))}
    assert twins == set(_CASE_TWINS.values())
    assert "pass" in Anchored("PA\u017f\u017fWORD=x").folded
    assert "key" in Anchored("api_\u212aey=x").folded
    assert "authorization:" in Anchored("author\u0131zation: Basic x").folded
    assert "authorization:" in Anchored("AUTHOR\u0130ZATION: Basic x").folded


@given(st.from_regex(re.compile(rf"(?:{_NAMES})", re.I), fullmatch=True))
def test_every_slot_name_holds_a_slot_anchor(name: str) -> None:
    assert not Anchored(f"{name}=x").folded.isdisjoint(_SLOT_ANCHORS), name


def test_conversation_prose_runs_no_rule() -> None:
    # LoCoMo-style turns: nothing in them can start a credential, so screening is the anchor
    # lookup alone (the write path's cost: 120 -> 12 us a turn).
    turns = [
        "[1:56 pm on 8 May, 2023] Caroline: Hey Mel! Good to see you! How have you been?",
        "[1:56 pm on 8 May, 2023] Melanie: Hey Caroline! I'm swamped with the kids & work. What's up with you?",
        "[7:55 pm on 9 June, 2023] Jon: I lost my job as a banker yesterday, so I'm gonna take a shot at starting my own dance studio.",
        "[2:32 pm on 29 January, 2023] Gina: Yeah, it's been a real grind, but it's been worth it. Thanks for asking!",
    ]
    assert [t for t in turns if Anchored(t).any()] == []
    assert all(find_secrets(t) == [] for t in turns)


def test_refusal_and_redaction_unchanged_for_the_corpus() -> None:
    for text, _kind in SECRETS:
        findings = find_secrets(text, every_rule=True)
        assert redact(text, find_secrets(text)) == redact(text, findings)
        assert screen("content", text, "redact").text == redact(text, findings)
