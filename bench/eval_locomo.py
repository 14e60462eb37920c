"""`make eval`: the LoCoMo retrieval eval, over MCP, against a private stack (or --url/--key).

For each conversation every dialog turn is stored with batch_remember (one `episode`
fragment per turn, one workspace per conversation, the workspace as topic), then every
question is asked verbatim with recall(text=question, workspace, pageSize=10) and the
returned fragment ids are scored against the question's evidence turns (bench.locomo: the
team eval's protocol and scoring). No LLM is involved: this measures retrieval alone.

  python -m bench.eval_locomo [--data locomo10.json] [--conversations conv-26,conv-30]
                              [--unanswerable bench/data/unanswerable.json]
                              [--per-conversation] [--save-ids ids.json --no-cleanup]

--data takes the published locomo10.json format; it defaults to the team's dev file
(../shared/eval/locomo-dev.json) when that is there. --unanswerable also asks, in every
conversation's workspace, questions about things never stored there and counts the replies
that say so (_meta.hints no_results). The last line printed is the headline:
  recall@10 <value> (cat 1-4, n=<questions>, conversations=<k>)

--per-conversation also prints each conversation's recall@10 and MRR (cat 1-4);
--save-ids with --no-cleanup writes each conversation's workspace and fragment id -> turn
map, so bench.locomo_rescore can rank the stored turns again in process (ranking changes
measured without ingesting again).
--reuse-ids takes such a file of the same stack: its conversations are asked again through
MCP without being stored again (a ranking change served by a restarted recall, same store).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from mcp import ClientSession

from bench import locomo
from bench.harness import Target, add_target_arguments, call, mcp_session, percentile, target_from

REPO_ROOT = Path(__file__).resolve().parent.parent
DEV_DATA = REPO_ROOT.parent / "shared" / "eval" / "locomo-dev.json"
# The team eval stores 200 turns per batch_remember call.
BATCH = 200


def fragment_ids(reply: dict[str, Any]) -> list[str]:
    items = reply.get("fragments")
    if items is None:
        items = reply.get("results", [])
    return [str(f["id"]) for f in items if isinstance(f, dict) and "id" in f]


def said_not_found(reply: dict[str, Any]) -> bool:
    return any(h.get("signal") == "no_results" for h in (reply.get("_meta") or {}).get("hints", []))


async def ingest(session: ClientSession, workspace: str, turns: list[locomo.Turn]) -> dict[str, str]:
    """Fragment id -> dia_id of the stored turns."""
    id_to_dia: dict[str, str] = {}
    for start in range(0, len(turns), BATCH):
        chunk = turns[start:start + BATCH]
        reply = await call(session, "batch_remember", {
            "workspace": workspace,
            "fragments": [{"content": t.content, "topic": workspace, "type": "episode"} for t in chunk],
        })
        results = reply.get("results", [])
        if len(results) != len(chunk):
            raise SystemExit(f"batch_remember returned {len(results)} results for {len(chunk)}")
        for turn, res in zip(chunk, results, strict=True):
            if not res.get("success", "id" in res):
                raise SystemExit(f"batch_remember refused {turn.dia_id}: {res}")
            id_to_dia[str(res["id"])] = turn.dia_id
    return id_to_dia


async def run(target: Target, args: argparse.Namespace, data: list[dict[str, Any]], unanswerable: list[str],
              reuse: dict[str, dict[str, Any]]) -> int:
    """`reuse`: conversations an earlier run stored (--save-ids --no-cleanup), asked again, not stored again."""
    run_id = uuid.uuid4().hex[:8]
    rows: list[tuple[int, dict[str, float]]] = []
    latencies: list[float] = []
    not_found = asked = 0
    ingest_turns, ingest_s = 0, 0.0
    per_conv: dict[str, list[tuple[int, dict[str, float]]]] = {}
    saved: dict[str, dict[str, Any]] = {}
    async with mcp_session(target) as session:
        for sample in data:
            workspace = f"locomo-{run_id}-{sample['sample_id']}"
            turns = locomo.turns_of(sample)
            if sample["sample_id"] in reuse:
                workspace, id_to_dia = reuse[sample["sample_id"]]["workspace"], reuse[sample["sample_id"]]["ids"]
            else:
                started = time.perf_counter()
                id_to_dia = await ingest(session, workspace, turns)
                ingest_s += time.perf_counter() - started
                ingest_turns += len(turns)
                await asyncio.sleep(args.settle)
            saved[sample["sample_id"]] = {"workspace": workspace, "ids": id_to_dia}

            def recall_args(text: str, ws: str = workspace) -> dict[str, Any]:
                return {"text": text, "workspace": ws, "pageSize": args.k, "tokenBudget": args.token_budget,
                        "fields": ["id", "content"]}

            for q in locomo.questions_of(sample, {t.dia_id for t in turns}):
                started = time.perf_counter()
                reply = await call(session, "recall", recall_args(q.text))
                latencies.append(time.perf_counter() - started)
                ranked = [id_to_dia.get(i, f"?{i}") for i in fragment_ids(reply)]
                rows.append((q.category, locomo.score(ranked, q.evidence)))
                per_conv.setdefault(sample["sample_id"], []).append(rows[-1])
                if args.verbose:
                    print(f"Q\t{q.category}\t{rows[-1][1]['recall@10']:.2f}\t{reply.get('searchPath')}\t{q.text}")
            for text in unanswerable:
                asked += 1
                reply = await call(session, "recall", recall_args(text))
                not_found += said_not_found(reply)
                if args.verbose:
                    print(f"U\t-\t{int(said_not_found(reply))}\t{reply.get('searchPath')}\t{text}")
            if args.cleanup and sample["sample_id"] not in reuse:
                await call(session, "forget", {"topic": workspace, "force": True})

    if args.save_ids:
        Path(args.save_ids).write_text(json.dumps(saved))
    if args.per_conversation:
        for line in locomo.per_conversation(per_conv):
            print(line)
    for line in locomo.report(rows):
        print(line)
    lat_ms = [s * 1000 for s in latencies]
    print(f"recall latency ms: p50 {percentile(lat_ms, 50):.1f}  p95 {percentile(lat_ms, 95):.1f}  "
          f"p99 {percentile(lat_ms, 99):.1f}  (n={len(lat_ms)})")
    if ingest_turns:
        print(f"ingest: {ingest_turns} turns in {ingest_s:.1f} s ({ingest_turns / max(ingest_s, 1e-9):.0f} turns/s)")
    if asked:
        print(f"never-stored questions answered no_results: {not_found}/{asked} ({not_found / asked:.1%})")
    main_rows = [r for cat, r in rows if cat != locomo.ADVERSARIAL]
    print(f"recall@10 {locomo.headline(rows):.3f} (cat 1-4, n={len(main_rows)}, conversations={len(data)})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(parser)
    parser.add_argument("--data", default=str(DEV_DATA) if DEV_DATA.is_file() else None,
                        help=f"LoCoMo samples in the published locomo10.json format (default {DEV_DATA} when present)")
    parser.add_argument("--conversations", help="comma-separated sample ids (default: all in --data)")
    parser.add_argument("--k", type=int, default=10, help="pageSize asked of recall")
    parser.add_argument("--token-budget", type=int, default=20000)
    parser.add_argument("--settle", type=float, default=0.0, help="seconds to wait after ingest")
    parser.add_argument("--no-cleanup", dest="cleanup", action="store_false", help="keep each conversation's fragments")
    parser.add_argument("--unanswerable", help="JSON {\"questions\": [...]} asked in every conversation's workspace")
    parser.add_argument("--verbose", action="store_true",
                        help="print each question's score (for never-stored ones: no_results) and searchPath, tab-separated")
    parser.add_argument("--per-conversation", action="store_true", help="also print each conversation's recall@10 and MRR")
    parser.add_argument("--save-ids", help="write {sample_id: {workspace, ids: {fragment id: dia_id}}} here (with --no-cleanup)")
    parser.add_argument("--reuse-ids", help="a --save-ids file of the same stack: its conversations are scored without being stored again")
    args = parser.parse_args(argv)
    if not args.data:
        parser.error(f"--data is required ({DEV_DATA} is not there)")
    if not Path(args.data).is_file():
        parser.error(f"no such file: {args.data}")
    data = locomo.load(Path(args.data), args.conversations)
    unanswerable = json.loads(Path(args.unanswerable).read_text())["questions"] if args.unanswerable else []
    reuse = json.loads(Path(args.reuse_ids).read_text()) if args.reuse_ids else {}
    with target_from(args) as target:
        return asyncio.run(run(target, args, data, unanswerable, reuse))


if __name__ == "__main__":
    sys.exit(main())
