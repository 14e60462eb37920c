// Dashboard: GET /stats (fragments, API calls, system metrics, searchMetrics, observability,
// queues, healthFlags) and GET /activity (the 10 latest fragments), refreshed every 5 s.
import { api } from "../lib/api.js";
import { anyValue, card, fmtTime, h, preview, replace, rowsOf, short, table, tile } from "../lib/dom.js";

export const REFRESH_MS = 5000;

function isScalar(v) { return v === null || ["string", "number", "boolean"].includes(typeof v); }

function healthFlags(flags) {
  const list = Array.isArray(flags) ? flags : Object.entries(flags ?? {}).filter(([, v]) => v).map(([k]) => k);
  if (!list.length) return h("p.ok", { id: "health-flags" }, "No health flags raised.");
  return h("ul.flags", { id: "health-flags" }, list.map((f) => h("li.flag", typeof f === "string" ? f : JSON.stringify(f))));
}

function statsView(stats) {
  const tiles = [];
  const sections = [];
  for (const [name, value] of Object.entries(stats ?? {})) {
    if (name === "healthFlags") continue;
    if (isScalar(value)) tiles.push(tile(name, value));
    else sections.push(card(name, anyValue(value)));
  }
  return [
    h("div.tiles", { id: "stat-tiles" }, tiles),
    card("health flags", healthFlags(stats?.healthFlags)),
    h("div.grid", sections),
  ];
}

function activityView(activity) {
  return table(rowsOf(activity, "activity", "items", "fragments"), [
    { key: "created_at", label: "when", render: (r) => fmtTime(r.created_at ?? r.createdAt) },
    { key: "id", render: (r) => short(r.id) },
    { key: "topic" },
    { key: "type" },
    { key: "key", render: (r) => r.key_name ?? r.keyName ?? (r.key_id ? short(r.key_id) : "master") },
    { key: "preview", render: (r) => preview(r.preview ?? r.content, 100) },
  ], { empty: "No fragments stored yet." });
}

export async function render(root, ctx) {
  const updated = h("p.muted", { id: "updated-at" }, "loading…");
  const statsBox = h("div", { id: "stats" });
  const activityBox = h("div", { id: "activity" });
  root.append(updated, statsBox, card("recent activity", activityBox));

  async function refresh() {
    const [stats, activity] = await Promise.allSettled([api("GET", "/stats"), api("GET", "/activity")]);
    if (!ctx.alive()) return;
    replace(statsBox, stats.status === "fulfilled" ? statsView(stats.value) : h("div.error", `stats: ${stats.reason.message}`));
    replace(activityBox, activity.status === "fulfilled" ? activityView(activity.value) : h("div.error", `activity: ${activity.reason.message}`));
    updated.textContent = `Updated ${fmtTime(new Date().toISOString())} · refreshes every ${REFRESH_MS / 1000} s`;
  }
  await refresh();
  const timer = setInterval(() => { refresh().catch(() => {}); }, REFRESH_MS);
  return () => clearInterval(timer);
}
