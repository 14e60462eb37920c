"""get_skill_guide's sections and the MCP prompts (seed: overview ... antipatterns)."""

from __future__ import annotations

SECTIONS: dict[str, str] = {
    "overview": (
        "Engram stores small atomic memories (fragments) and recalls them with layered search: "
        "L1 cache, L2 keyword / full-text, L2.5 graph neighbours, L3 semantic vectors, fused and packed "
        "into a token budget. One fragment = one fact, decision, error, preference, procedure, relation "
        "or episode, 1-3 sentences."
    ),
    "lifecycle": (
        "Session start: call context() to load preferences, error patterns and procedures. During work: "
        "remember() each decision, error and procedure as it happens; recall() before solving something "
        "you may have solved before. Session end: reflect() with summary, decisions, errors_resolved, "
        "new_procedures and open_questions. Sessions that end without reflect are reflected automatically."
    ),
    "keywords": (
        "Give 2-6 specific keywords per fragment: product names, error codes, file names, commands. "
        "Keywords you pass come first; keywords extracted from the content are merged after them "
        "(deduplicated, at most 10). Avoid generic words such as 'issue' or 'update'."
    ),
    "search": (
        "recall(keywords=[...]) for exact terms, recall(text='...') for meaning; both together fuse the "
        "rankings. Use topic, type, workspace, timeRange and caseId to narrow. pageSize is 20 by default "
        "(max 50) and tokenBudget 1000; follow nextCursor for more. fields=[...] returns sparse fragments."
    ),
    "episode": (
        "type='episode' keeps a narrative of what happened (up to 4000 characters, not cut at 300). Use "
        "goal, outcome, phase and resolutionStatus so later sessions can reuse the story."
    ),
    "multiplatform": (
        "Several agents can share one key: pass agentId to keep their fragments apart, and "
        "includePeerAgents=true on recall to read each other's. Key groups share visibility between keys; "
        "workspaces separate projects within a key."
    ),
    "codex": (
        "Command-line coding agents: call context() when a task starts, remember() after each verified "
        "fix with the exact command or file, and reflect() before the final answer."
    ),
    "tools": (
        "remember, batch_remember (<=200 per call), amend, forget, link, reflect write; recall, context, "
        "memory_stats, graph_explore, fragment_history, reconstruct_history, search_traces read; "
        "tool_feedback rates a result; session_rotate issues a new session id; memory_consolidate is admin."
    ),
    "importance": (
        "importance 0-1 defaults by type. Raise it for decisions and preferences that must survive; "
        "isAnchor=true exempts a fragment from decay and expiry. supersedes=[ids] retires older fragments."
    ),
    "experiential": (
        "Record how a problem was solved, not only the answer: the error (type='error'), its cause, the "
        "fix (type='procedure') and a link resolved_by between them. graph_explore follows those links."
    ),
    "cbr": (
        "Case-based reasoning: give related fragments the same caseId, mark progress with phase and "
        "resolutionStatus, and recall(caseMode=true) to get similar past cases as goal / events / outcome."
    ),
    "triggers": (
        "Remember when: a decision is made, an error is diagnosed, a fix is verified, the user states a "
        "preference, a procedure is established. Recall when: starting a task, meeting an error, before "
        "asking the user something they may have told you before."
    ),
    "antipatterns": (
        "Do not store whole transcripts, raw tool output, secrets or one-off chatter. Do not put several "
        "facts in one fragment. Do not recall with a single vague keyword. Do not forget error fragments "
        "without remembering the fix."
    ),
}


def guide(section: str | None) -> dict[str, object]:
    if section is not None:
        return {"section": section, "content": SECTIONS[section]}
    text = "\n\n".join(f"## {name}\n{body}" for name, body in SECTIONS.items())
    return {"sections": list(SECTIONS), "content": text}


PROMPTS: dict[str, tuple[str, list[tuple[str, str, bool]]]] = {
    "analyze-session": (
        "Session activity analysis: pick out the decisions, errors and procedures worth remembering.",
        [("focus", "Optional area to concentrate on", False)],
    ),
    "retrieve-relevant-memory": (
        "Guide for finding the best context on a subject with keyword and semantic search together.",
        [("topic", "The subject to retrieve memory about", True)],
    ),
    "onboarding": (
        "How to use the memory tools: when to call which, learnt by the agent itself.",
        [],
    ),
}


def prompt_text(name: str, arguments: dict[str, str]) -> str:
    if name == "analyze-session":
        focus = arguments.get("focus")
        return (
            "Review this conversation and extract what is worth keeping across sessions: decisions with "
            "their rationale, errors with cause and fix, procedures that worked, stated preferences. "
            + (f"Concentrate on: {focus}. " if focus else "")
            + "Store each as one atomic fragment with remember (type decision / error / procedure / "
            "preference, 2-6 specific keywords), link errors to their fixes with link(relationType="
            "'resolved_by'), and finish with reflect."
        )
    if name == "retrieve-relevant-memory":
        topic = arguments.get("topic", "")
        return (
            f"Find what memory holds about: {topic}. First recall with 2-4 exact keywords (names, codes, "
            f"files) from the subject; then recall with text='{topic}' for meaning; if results are thin, "
            "widen with contextText or drop the topic filter. Use graph_explore on an error fragment to "
            "follow its causes and fixes. Quote fragment ids you rely on."
        )
    return "Read the skill guide below, then use the memory tools as it describes.\n\n" + str(guide(None)["content"])
