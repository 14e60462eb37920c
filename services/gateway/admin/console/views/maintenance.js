// Maintenance: the consolidation cycle (status, run now, every run's stage report; the
// cycle runs for every tenant, as the scheduler's does), fsck
// (start, progress while it runs, its issues, apply the chosen fixes) and the anomalies the
// last cycle found.
import { api } from "../lib/api.js";
import { anyValue, card, field, fmtTime, h, replace, rowsOf, select, short, table } from "../lib/dom.js";

const POLL_MS = 1500;
// The cycle's stages, in order (shared/contract/maintenance.py CONSOLIDATION_STAGES; a test
// keeps the two lists equal).
export const STAGES = [
  "embedding_backfill", "passage_backfill", "ttl_tiers", "importance_decay", "activation_decay", "expiry_gc", "exact_dedup",
  "semantic_dedup", "contradictions", "supersession", "co_retrieval", "session_cleanup", "anomalies",
];
const DONE = new Set(["succeeded", "failed", "skipped", "cancelled", "canceled"]);

export const paths = {
  startConsolidation: "/maintenance/consolidation",
};

function say(box, text, kind = "ok") { replace(box, h(`p.${kind}`, { role: kind === "error" ? "alert" : "status" }, text)); }

/** A running job's progress row: consolidation {stage, done, total}, fsck {phase, phaseIndex, phases, fragments, issues}. */
function progressView(p) {
  const done = p.done ?? (p.phaseIndex != null ? p.phaseIndex - 1 : null);
  const total = p.total ?? p.phases ?? null;
  const what = p.stage ? `stage ${p.stage}` : p.phase ? `phase ${p.phase}` : null;
  const counts = [p.fragments != null ? `${p.fragments} fragments` : null, p.issues != null ? `${p.issues} issues so far` : null].filter(Boolean).join(" · ");
  return h("div.progress", { id: "run-progress" },
    total ? h("progress", { max: total, value: Math.max(0, done ?? 0) }) : null,
    h("span", [total && done != null ? `${done + 1} of ${total}` : null, what, counts].filter(Boolean).join(" · ") || JSON.stringify(p)),
  );
}

function stageReport(run, id = "run-report") {
  const stages = run?.result?.stages ?? {};
  const rows = Object.entries(stages).map(([name, stage]) => ({ name, ...(stage && typeof stage === "object" ? stage : { value: stage }) }));
  const header = h("p", { class: `run-status status-${run.status}` },
    `Run ${run.runId} · ${run.job} · ${run.tenant ?? ""} · ${run.status}`,
    run.startedAt ? ` · started ${fmtTime(run.startedAt)}` : "", run.finishedAt ? ` · finished ${fmtTime(run.finishedAt)}` : "");
  const progress = !DONE.has(run.status) && run.progress ? progressView(run.progress) : null;
  return h("div.run-report", { id, dataset: { runId: run.runId, status: run.status } },
    header,
    run.error ? h("p.error", run.error) : null,
    progress,
    rows.length ? table(rows, [
      { key: "name", label: "stage" },
      { key: "processed" },
      { key: "durationMs", label: "ms" },
      { key: "skipped", render: (r) => (r.skipped ? String(r.skipped) : "") },
      { key: "error", render: (r) => r.error ?? "" },
      { key: "details", render: (r) => {
        const rest = Object.fromEntries(Object.entries(r).filter(([k]) => !["name", "processed", "durationMs", "skipped", "error"].includes(k)));
        return Object.keys(rest).length ? JSON.stringify(rest).slice(0, 200) : "";
      } },
    ], { rowClass: (r) => (r.error ? "failed" : null) }) : (DONE.has(run.status) ? anyValue(run.result) : h("p.muted", "Waiting for the worker…")),
  );
}

async function poll(path, { alive, onUpdate, timers }) {
  for (;;) {
    const run = await api("GET", path);
    if (!alive()) return run;
    onUpdate(run);
    if (DONE.has(run.status)) return run;
    await new Promise((resolve) => { timers.push(setTimeout(resolve, POLL_MS)); });
  }
}

function fsckIssues(run, box, status, reload) {
  const issues = run.issues ?? [];
  const checks = new Map();
  const rows = table(issues, [
    { key: "pick", label: "", render: (i) => {
      if (i.status !== "open") return "";
      const box_ = h("input", { type: "checkbox", name: "issue", value: i.id });
      checks.set(i.id, box_);
      return box_;
    } },
    { key: "type" }, { key: "severity" }, { key: "confidence" },
    { key: "fragments", render: (i) => (i.fragmentIds ?? []).map((f) => short(f, 10)).join(", ") },
    { key: "reason" },
    { key: "actions", render: (i) => (i.actions ?? []).map((a) => `${a.action} ${short(a.id, 10)}${a.by ? ` → ${short(a.by, 10)}` : ""}`).join("; ") },
    { key: "status" },
  ], { empty: "No issues found." });
  const apply = async (ids) => {
    try {
      const r = await api("POST", `/fsck/${run.runId}/apply`, { body: ids ? { issueIds: ids } : {} });
      say(status, `Applied: ${JSON.stringify(r)}`);
      await reload();
    } catch (e) { say(status, e.message, "error"); }
  };
  const open = issues.filter((i) => i.status === "open").length;
  replace(box, rows, open && run.status === "succeeded" ? h("div.actions",
    h("button", { type: "button", id: "fsck-apply-selected", onclick: () => { const ids = [...checks].filter(([, c]) => c.checked).map(([id]) => id); if (ids.length) apply(ids); } }, "Apply selected"),
    h("button.danger", { type: "button", id: "fsck-apply-all", onclick: () => apply(null) }, `Apply all ${open} open`),
  ) : null);
}

export async function render(root, { alive }) {
  const timers = [];
  const status = h("div", { id: "maintenance-status" });
  const consolidation = h("div", { id: "consolidation" }, h("p.muted", "loading…"));
  const report = h("div", { id: "consolidation-report" });
  const runs = h("div", { id: "runs" });
  const fsckBox = h("div", { id: "fsck" });
  const fsckIssuesBox = h("div", { id: "fsck-issues" });
  const anomalies = h("div", { id: "anomalies" });

  async function loadStatus() {
    const data = await api("GET", "/maintenance/consolidation");
    if (alive()) replace(consolidation, anyValue(data));
  }
  async function loadRuns() {
    const data = await api("GET", "/maintenance/runs", { query: { limit: 20 } });
    if (!alive()) return;
    replace(runs, table(rowsOf(data, "runs"), [
      { key: "runId", label: "run" }, { key: "job" }, { key: "tenant" }, { key: "status" },
      { key: "startedAt", label: "started", render: (r) => fmtTime(r.startedAt) },
      { key: "finishedAt", label: "finished", render: (r) => fmtTime(r.finishedAt) },
      { key: "error", render: (r) => r.error ?? "" },
    ], { onRow: (r) => showRun(r.runId), empty: "No runs yet." }));
  }
  async function showRun(runId) {
    const run = await poll(`/maintenance/runs/${runId}`, { alive, timers, onUpdate: (r) => replace(report, stageReport(r)) });
    if (alive() && DONE.has(run.status)) { await loadRuns(); await loadStatus(); }
  }
  async function showFsck(runId) {
    const onUpdate = (run) => {
      replace(fsckBox, stageReport(run, "fsck-report"));
      fsckIssues(run, fsckIssuesBox, status, () => showFsck(runId));
    };
    const run = await poll(`/fsck/${runId}`, { alive, timers, onUpdate });
    if (alive()) { onUpdate(run); await loadRuns(); }
  }

  const keys = await api("GET", "/keys").catch(() => []);
  const stageBoxes = STAGES.map((name) => h("label.check", h("input", { type: "checkbox", name: "stage", value: name }), name));
  const runNow = h("button.primary", { type: "button", id: "run-consolidation" }, "Run consolidation now");
  runNow.addEventListener("click", async () => {
    runNow.disabled = true;
    const stages = stageBoxes.map((l) => l.firstChild).filter((c) => c.checked).map((c) => c.value);
    try {
      const started = await api("POST", paths.startConsolidation, { body: stages.length ? { stages } : {} });
      const runId = started?.runId ?? started?.id ?? started?.run_id;
      say(status, `Consolidation run ${runId} queued (${stages.length ? stages.join(", ") : "every stage"}).`);
      if (runId != null) await showRun(runId);
    } catch (e) { say(status, `Could not start consolidation: ${e.message}`, "error"); } finally { runNow.disabled = false; }
  });
  const fsckTenant = select("fsck_key", [["", "every tenant"], ["master", "the master key's own"], ...keys.map((k) => [k.id, `key ${k.name}`])], "");
  const fsckIncremental = h("input", { type: "checkbox", name: "incremental" });
  const startFsck = h("button.primary", { type: "button", id: "start-fsck" }, "Start fsck");
  startFsck.addEventListener("click", async () => {
    startFsck.disabled = true;
    const scope = fsckTenant.value === "" ? { scope: "all" } : fsckTenant.value === "master" ? { scope: "master" } : { scope: "key", keyId: fsckTenant.value };
    try {
      const started = await api("POST", "/fsck", { body: { ...scope, incremental: fsckIncremental.checked } });
      say(status, `fsck run ${started.id} queued (${started.tenant}).`);
      await showFsck(started.id);
    } catch (e) { say(status, `Could not start fsck: ${e.message}`, "error"); } finally { startFsck.disabled = false; }
  });

  root.append(status,
    card("consolidation", consolidation,
      h("details.stages", h("summary", "Stages (none ticked: every enabled stage)"), h("div.checks.wrap", { id: "consolidation-stages" }, stageBoxes)),
      h("div.actions", runNow), report),
    card("runs", h("p.muted", "Every maintenance run, newest first; click one for its stage report."), runs),
    card("fsck", h("div.filters", field("Tenant", fsckTenant), h("label.check", fsckIncremental, "incremental"), startFsck), fsckBox, fsckIssuesBox),
    card("anomalies (last scan)", anomalies),
  );
  api("GET", "/memory/anomalies").then((a) => alive() && replace(anomalies, anyValue(a))).catch((e) => alive() && replace(anomalies, h("div.error", e.message)));
  await Promise.all([loadStatus(), loadRuns()]);
  return () => timers.forEach(clearTimeout);
}
