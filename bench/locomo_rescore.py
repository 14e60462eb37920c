"""LoCoMo turns ranked again in process: ranking changes measured without ingesting again,
and fusion constants chosen leave-one-conversation-out.

    python -m bench.eval_locomo --url URL --key KEY --data locomo10.json --no-cleanup --save-ids ids.json
    python -m bench.locomo_rescore --database-url DSN --data locomo10.json --ids ids.json
                                   [--conversations conv-41,...] [--dev conv-26,conv-30]
                                   [--set fusion.QA_WEIGHT=0] [--grid fusion.NEIGHBOUR_WEIGHT=0.2,0.3,0.4]

The recall service's own `recall()` (this working tree's code) runs in this process against
the stack's Postgres, with no L1 cache and no side effects (access counts and activation are
not touched, so repeated runs rank the same store alike). The questions, scoring and report
are bench.locomo's, as `make eval` prints them, plus each conversation's recall@10 and MRR.

--grid NAME=v1,v2,... (NAME: `fusion.X` or `search.X`, a module constant of services.recall)
scores every value, then the leave-one-conversation-out check: for each conversation the
value with the best mean recall@10 over the OTHER conversations (ties: the first listed) is
chosen and that conversation is scored with it; the held-out numbers are pooled over all
questions (categories 1-4).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import locomo
from bench.harness import percentile
from services.common.internal import ToolContext
from services.recall import fusion
from services.recall import search as search_mod
from services.recall.service import ReadResources, recall
from shared.db import create_pool
from shared.domain.principal import Principal
from shared.domain.tokens import TokenCounter
from shared.embeddings import load_embedder, model_dir
from shared.repositories import vector_search
from shared.settings import RecallSettings

Rows = list[tuple[int, dict[str, float]]]
MODULES = {"fusion": fusion, "search": search_mod}


class NoEffects:
    """Side effects (search events, access counts) are not written: the store stays as ingested."""

    async def submit(self, item: dict[str, Any]) -> None:
        return None


async def score_all(res: ReadResources, data: list[dict[str, Any]], ids: dict[str, Any],
                    latencies: list[float]) -> dict[str, Rows]:
    ctx = ToolContext(principal=Principal.master())
    out: dict[str, Rows] = {}
    for sample in data:
        saved = ids[sample["sample_id"]]
        id_to_dia: dict[str, str] = saved["ids"]
        rows: Rows = []
        for q in locomo.questions_of(sample, set(id_to_dia.values())):
            started = time.perf_counter()
            body, _ = await recall(res, ctx, {"text": q.text, "workspace": saved["workspace"], "pageSize": 10,
                                              "tokenBudget": 20000, "fields": ["id", "content"]})
            latencies.append((time.perf_counter() - started) * 1000)
            ranked = [id_to_dia.get(str(f["id"]), "?") for f in body.get("fragments", [])]
            rows.append((q.category, locomo.score(ranked, q.evidence)))
        out[sample["sample_id"]] = rows
    return out


def _main_mean(rows: Rows, metric: str = "recall@10") -> float:
    main = [r[metric] for cat, r in rows if cat != locomo.ADVERSARIAL]
    return statistics.fmean(main) if main else 0.0


def leave_one_out(by_value: dict[str, dict[str, Rows]]) -> list[str]:
    values = list(by_value)
    convs = list(next(iter(by_value.values())))
    held: Rows = []
    lines = ["leave-one-conversation-out: conversation, value chosen on the others, its recall@10 / MRR there"]
    for c in convs:
        def others(v: str, c: str = c) -> float:
            return statistics.fmean(_main_mean(by_value[v][o]) for o in convs if o != c)
        best = max(values, key=others)  # max keeps the first of equals
        rows = by_value[best][c]
        held.extend(rows)
        lines.append(f"  {c:<10} {best:>8}  {_main_mean(rows):.3f} / {_main_mean(rows, 'mrr'):.3f}")
    lines.append(f"LOO pooled (cat 1-4, n={sum(1 for cat, _ in held if cat != locomo.ADVERSARIAL)}): "
                 f"recall@10 {_main_mean(held):.3f}  MRR {_main_mean(held, 'mrr'):.3f}")
    return lines


async def run(args: argparse.Namespace) -> int:
    data = locomo.load(Path(args.data), args.conversations)
    ids = json.loads(Path(args.ids).read_text())
    data = [s for s in data if s["sample_id"] in ids]
    settings = RecallSettings()
    pool = await create_pool(
        args.database_url, min_size=2, max_size=4,
        server_settings=vector_search.graph_settings(settings.hnsw_ef_search),
    )
    res = ReadResources(pool=pool, embedder=load_embedder(latency=True), tokens=TokenCounter(model_dir() / "tokenizer.json"),
                        settings=settings, effects=NoEffects())  # type: ignore[arg-type]
    for fixed in args.set or []:
        name, _, raw = fixed.partition("=")
        module_name, _, attr = name.partition(".")
        module = MODULES[module_name]
        setattr(module, attr, type(getattr(module, attr))(raw))
    grid: list[tuple[str, Any]] = [("default", None)]
    target = None
    if args.grid:
        name, _, raw = args.grid.partition("=")
        module_name, _, attr = name.partition(".")
        target = (MODULES[module_name], attr)
        kind = type(getattr(*target))
        grid = [(v, kind(v)) for v in raw.split(",")]
    by_value: dict[str, dict[str, Rows]] = {}
    latencies: list[float] = []
    try:
        original = getattr(*target) if target else None
        for label, value in grid:
            if target:
                setattr(*target, value)
            by_value[label] = await score_all(res, data, ids, latencies)
            allrows = [r for rows in by_value[label].values() for r in rows]
            print(f"== {args.grid or 'current code'}: {label}")
            for line in locomo.per_conversation(by_value[label]) + locomo.report(allrows):
                print(line)
            print(f"recall@10 {locomo.headline(allrows):.3f}  MRR {_main_mean(allrows, 'mrr'):.3f}")
            if args.dev:
                dev = set(args.dev.split(","))
                for name, keep in (("dev", True), ("unseen", False)):
                    part = [r for c, rows in by_value[label].items() if (c in dev) == keep for r in rows]
                    if part:
                        print(f"{name}: recall@10 {_main_mean(part):.3f}  MRR {_main_mean(part, 'mrr'):.3f}  "
                              f"(n={sum(1 for cat, _ in part if cat != locomo.ADVERSARIAL)})")
            sys.stdout.flush()
        if target:
            setattr(*target, original)
    finally:
        await pool.close()
    print(f"recall() in process: p50 {percentile(latencies, 50):.1f} ms  p95 {percentile(latencies, 95):.1f} ms (n={len(latencies)})")
    if len(grid) > 1 and len(data) > 1:
        for line in leave_one_out(by_value):
            print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--data", required=True, help="LoCoMo samples in the published locomo10.json format")
    parser.add_argument("--ids", required=True, help="bench.eval_locomo --save-ids output of the same stack")
    parser.add_argument("--conversations", help="comma-separated sample ids (default: all saved)")
    parser.add_argument("--dev", help="comma-separated sample ids also pooled apart from the rest (e.g. conv-26,conv-30)")
    parser.add_argument("--set", action="append", help="NAME=value: a services.recall module constant fixed for the whole run (repeatable)")
    parser.add_argument("--grid", help="NAME=v1,v2,...: a services.recall module constant (fusion.X / search.X) to vary")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
