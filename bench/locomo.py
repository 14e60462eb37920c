"""LoCoMo as the retrieval eval reads it: turns, evidence, per-question scores, the report.

The same protocol and scoring as the team's eval (../shared/eval/locomo_eval.py and its
README), kept here so `make eval` needs nothing outside the repository: every dialog turn
is one fragment `[<session date>] <speaker>: <text>` (a shared image's caption appended);
a question's evidence ids (`D1:3`, also written `D:1:3` or `D1:03`) are scored against the
returned fragments. recall@k = |evidence ∩ top k| / |evidence| (the official LoCoMo
definition); hit@10, all@10, MRR within the top 10, nDCG@10. The headline is recall@10 over
categories 1-4; adversarial questions (5) are reported on their own row.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# LoCoMo's category numbers; the dataset's own labels.
CATEGORY = {4: "single-hop", 1: "multi-hop", 2: "temporal", 3: "open-domain", 5: "adversarial"}
ADVERSARIAL = 5
METRICS = ("recall@5", "recall@10", "hit@10", "all@10", "mrr", "ndcg@10")
_DIA = re.compile(r"D:?(\d+):0*(\d+)")
_SESSION = re.compile(r"session_(\d+)")


@dataclass(frozen=True)
class Turn:
    dia_id: str
    content: str


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: list[str]


def load(path: Path, conversations: str | None = None) -> list[dict[str, Any]]:
    """The published locomo10.json format (a list of samples); `conversations`: comma-separated sample ids."""
    data = json.loads(path.read_text())
    if conversations:
        wanted = set(conversations.split(","))
        data = [s for s in data if s["sample_id"] in wanted]
    return data


def turns_of(sample: dict[str, Any]) -> list[Turn]:
    conv = sample["conversation"]
    sessions = sorted(int(m.group(1)) for k in conv if (m := _SESSION.fullmatch(k)))
    out = []
    for s in sessions:
        when = conv.get(f"session_{s}_date_time", "")
        for turn in conv[f"session_{s}"]:
            text = turn["text"]
            if turn.get("blip_caption"):
                text += f" [shares {turn['blip_caption']}]"
            out.append(Turn(turn["dia_id"], f"[{when}] {turn['speaker']}: {text}"))
    return out


def questions_of(sample: dict[str, Any], valid: set[str]) -> list[Question]:
    """The sample's questions with evidence among its turns (others cannot be scored)."""
    out = []
    for qa in sample["qa"]:
        ids: list[str] = []
        for raw in qa.get("evidence", []):
            for m in _DIA.finditer(str(raw)):
                dia = f"D{m.group(1)}:{m.group(2)}"
                if dia in valid and dia not in ids:
                    ids.append(dia)
        if ids:
            out.append(Question(qa["question"], qa["category"], ids))
    return out


def score(ranked: Sequence[str], gold: Sequence[str]) -> dict[str, float]:
    gold_set = set(gold)
    first = next((i for i, r in enumerate(ranked) if r in gold_set), None)
    dcg = sum(1 / math.log2(i + 2) for i, r in enumerate(ranked[:10]) if r in gold_set)
    idcg = sum(1 / math.log2(i + 2) for i in range(min(len(gold_set), 10)))
    return {
        "recall@5": len(gold_set & set(ranked[:5])) / len(gold_set),
        "recall@10": len(gold_set & set(ranked[:10])) / len(gold_set),
        "hit@10": float(bool(gold_set & set(ranked[:10]))),
        "all@10": float(gold_set <= set(ranked[:10])),
        "mrr": 0.0 if first is None else 1 / (first + 1),
        "ndcg@10": dcg / idcg,
    }


def headline(rows: Sequence[tuple[int, dict[str, float]]]) -> float:
    main = [r for cat, r in rows if cat != ADVERSARIAL]
    return statistics.fmean(r["recall@10"] for r in main) if main else 0.0


def report(rows: Sequence[tuple[int, dict[str, float]]]) -> list[str]:
    """One line per category and for categories 1-4, as the team eval prints them."""
    lines = [f"{'category':<14}{'n':>6}" + "".join(f"{m:>11}" for m in METRICS)]
    groups = [(CATEGORY[c], [r for cat, r in rows if cat == c]) for c in (4, 1, 2, 3, 5)]
    groups.append(("cat 1-4", [r for cat, r in rows if cat != ADVERSARIAL]))
    for name, group in groups:
        if group:
            means = [statistics.fmean(r[m] for r in group) for m in METRICS]
            lines.append(f"{name:<14}{len(group):>6}" + "".join(f"{v:>11.3f}" for v in means))
    return lines


def per_conversation(groups: dict[str, Sequence[tuple[int, dict[str, float]]]]) -> list[str]:
    """recall@10 and MRR over categories 1-4 of each conversation, then their macro mean."""
    lines = [f"{'conversation':<14}{'n':>6}{'recall@10':>11}{'mrr':>11}"]
    macro: list[tuple[float, float]] = []
    for sample_id, rows in groups.items():
        main = [r for cat, r in rows if cat != ADVERSARIAL]
        if not main:
            continue
        r10, mrr = statistics.fmean(r["recall@10"] for r in main), statistics.fmean(r["mrr"] for r in main)
        macro.append((r10, mrr))
        lines.append(f"{sample_id:<14}{len(main):>6}{r10:>11.3f}{mrr:>11.3f}")
    if len(macro) > 1:
        lines.append(f"{'macro mean':<14}{'':>6}{statistics.fmean(a for a, _ in macro):>11.3f}"
                     f"{statistics.fmean(b for _, b in macro):>11.3f}")
    return lines
