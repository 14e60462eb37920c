"""Tokens an agent pays for a default recall reply of two short, linked facts.

Stores two related one-sentence facts in a fresh workspace, links them (as the worker's
link_new_fragments or an agent's link would), then recalls with the default arguments
(`text` and the workspace only) and counts the reply's JSON text, as the client receives it,
with the recall service's own token counter (shared.domain.tokens.TokenCounter over the
embedding model's tokenizer: the counter tokenBudget is measured in). Prints the total and
its share per part, so a change to the reply shape can be measured before and after:

    python -m bench.reply_tokens            # a private stack
    python -m bench.reply_tokens --url http://127.0.0.1:57332/mcp --key <master key>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from typing import Any

from bench.harness import Target, add_target_arguments, call, mcp_session, print_table, target_from
from shared.domain.tokens import TokenCounter
from shared.embeddings import model_dir

FACTS = (
    "The checkout service reads its Stripe keys from the payments vault path.",
    "Rotating the payments vault path requires restarting the checkout service.",
)
QUERY = "where does checkout get its Stripe keys?"


async def default_reply(target: Target) -> tuple[dict[str, Any], str]:
    """The parsed reply and its JSON text, as the MCP client received it."""
    workspace = f"bench-reply-{uuid.uuid4().hex[:8]}"
    async with mcp_session(target) as session:
        ids = [
            (await call(session, "remember", {"content": fact, "topic": "checkout", "type": "fact", "workspace": workspace}))["id"]
            for fact in FACTS
        ]
        await call(session, "link", {"fromId": ids[1], "toId": ids[0], "relationType": "related"})
        result = await session.call_tool("recall", {"text": QUERY, "workspace": workspace})
    text = result.content[0].text
    return json.loads(text), text


def report(reply: dict[str, Any], text: str, tokens: TokenCounter) -> None:
    total = tokens.count(text)
    fragments = reply.get("fragments", [])
    rows = [["whole reply", str(total), str(len(text))]]
    for i, fragment in enumerate(fragments):
        linked = fragment.get("linked") or []
        rows.append([f"fragments[{i}]", str(tokens.count_json(fragment)), str(len(json.dumps(fragment, ensure_ascii=False)))])
        if linked:
            rows.append([f"fragments[{i}].linked", str(tokens.count_json(linked)), str(len(json.dumps(linked, ensure_ascii=False)))])
    rest = {k: v for k, v in reply.items() if k != "fragments"}
    rows.append(["everything but fragments", str(tokens.count_json(rest)), str(len(json.dumps(rest, ensure_ascii=False)))])
    print_table(f"default recall reply of {len(fragments)} fragments", ["part", "tokens", "chars"], rows)
    print(f"reply_tokens={total}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(parser)
    parser.add_argument("--show", action="store_true", help="print the reply itself")
    args = parser.parse_args(argv)
    tokens = TokenCounter(model_dir() / "tokenizer.json")
    with target_from(args) as target:
        reply, text = asyncio.run(default_reply(target))
    if args.show:
        print(json.dumps(reply, ensure_ascii=False, indent=1))
    report(reply, text, tokens)


if __name__ == "__main__":
    main()
