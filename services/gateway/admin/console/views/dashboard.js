// Dashboard: GET /stats (fragments, API calls, system metrics, searchMetrics, observability,
// queues, healthFlags) and GET /activity (the 10 latest fragments), refreshed every 5 s.
import { api } from "../lib/api.js";
import { anyValue, card, fmtBytes, fmtTime, h, label, preview, replace, rowsOf, short, table, tile } from "../lib/dom.js";

export const REFRESH_MS = 5000;

function isScalar(v) { return v === null || ["string", "number", "boolean"].includes(typeof v); }

function healthFlags(flags) {
  const list = Array.isArray(flags) ? flags : Object.entries(flags ?? {}).filter(([, v]) => v).map(([k]) => k);
  if (!list.length) return h("p.ok", { id: "health-flags" }, "No health flags raised.");
  return h("ul.flags", { id: "health-flags" }, list.map((f) => h("li.flag", typeof f === "string" ? f : JSON.stringify(f))));
}

function duration(seconds) {
  const s = Math.max(0, Math.floor(Number(seconds) || 0));
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  return d ? `${d}d ${hh}h` : hh ? `${hh}h ${String(mm).padStart(2, "0")}m` : `${mm}m ${String(s % 60).padStart(2, "0")}s`;
}

/** cpu / memory / disk as meters (percent), anything else of the section as a value. */
function systemView(system) {
  return h("div.meters", Object.entries(system ?? {}).map(([name, value]) => {
    if (typeof value === "number" && ["cpu", "memory", "disk"].includes(name)) {
      const level = value >= 90 ? "bad" : value >= 75 ? "warn" : "ok";
      return h("div.meter-row", h("span.meter-label", label(name)), h("meter", { min: 0, max: 100, low: 75, high: 90, optimum: 0, value, class: level }), h("span", `${value}%`));
    }
    return h("div.meter-row", h("span.meter-label", label(name)), h("span", /bytes$/i.test(name) ? fmtBytes(value) : String(value ?? "—")));
  }));
}

function statsView(stats) {
  const tiles = [];
  const sections = [];
  for (const [name, value] of Object.entries(stats ?? {})) {
    if (name === "healthFlags") continue;
    if (name === "uptime" && typeof value === "number") tiles.push(tile(name, duration(value)));
    else if (isScalar(value)) tiles.push(tile(name, value));
    else if (name === "system") sections.push(card(name, systemView(value)));
    else sections.push(card(label(name), anyValue(value)));
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
    { key: "id", render: (r) => h("code", short(r.id, 12)) },
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
