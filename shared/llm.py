"""The one LLM client: an OpenAI-compatible chat completions endpoint, optional.

Everything in maintenance works without it; when LLM_BASE_URL and LLM_MODEL are set it only
improves judgement (session summaries, contradiction checks). Every call is bounded by a
timeout (GEMINI_TIMEOUT_MS semantics from the reference's AutoReflect: default 30 s, never
above 40 s -- a 60 s gateway cut-off must keep a margin) and by a per-run call budget.
A failed or timed-out call is a None answer, never a failed job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx

logger = logging.getLogger(__name__)

from shared.settings import MAX_TIMEOUT_MS, LLMSettings  # noqa: E402,F401  (re-exported)


@dataclass
class LLMBudget:
    remaining: int
    used: int = 0
    failed: int = 0

    def take(self) -> bool:
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        self.used += 1
        return True

    def report(self) -> dict[str, int]:
        return {"llmCalls": self.used, "llmFailed": self.failed, "llmBudgetLeft": self.remaining}


class LLMClient:
    """Synchronous on purpose: it runs inside a Celery task, one call at a time."""

    def __init__(self, settings: LLMSettings) -> None:
        self.settings = settings

    @property
    def configured(self) -> bool:
        return self.settings.configured

    def budget(self) -> LLMBudget:
        return LLMBudget(self.settings.max_calls_per_run if self.configured else 0)

    def complete(self, system: str, prompt: str, budget: LLMBudget, *, max_tokens: int = 400) -> str | None:
        base_url = self.settings.base_url
        if not self.configured or base_url is None or not budget.take():
            return None
        url = base_url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}
        body = {
            "model": self.settings.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        try:
            response = httpx.post(url, json=body, headers=headers, timeout=self.settings.timeout_ms / 1000)
            response.raise_for_status()
            return str(response.json()["choices"][0]["message"]["content"]).strip() or None
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError):
            budget.failed += 1
            logger.warning("LLM call failed; continuing without it", exc_info=True)
            return None


def load_llm() -> LLMClient:
    return LLMClient(LLMSettings())
