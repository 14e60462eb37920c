// Sessions: GET /sessions (status, activity, the unreflected count), one session's detail
// (segments, tool calls, search events, tool feedback), reflect a segment, end a session,
// clean up expired sessions, reflect every unreflected one.
import { api } from "../lib/api.js";
import { anyValue, card, confirmButton, field, fmtTime, h, label, replace, rowsOf, select, short, table } from "../lib/dom.js";

const STATUSES = ["active", "ended", "all"];
const SHOWN_ELSEWHERE = new Set(["segments", "activity"]);

function say(box, text, kind = "ok") { replace(box, h(`p.${kind}`, { role: kind === "error" ? "alert" : "status" }, text)); }

const idOf = (s) => s.sessionId ?? s.id ?? s.session_id;

async function reflect(segmentId, status) {
  try {
    const r = await api("POST", `/sessions/${encodeURIComponent(segmentId)}/reflect`);
    say(status, r?.alreadyReflected ? `Reflect of ${segmentId} queued (it had been reflected before).` : `Reflect of ${segmentId} queued.`);
  } catch (e) { say(status, e.message, "error"); }
}

async function detail(root, id, { alive, navigate }) {
  const status = h("div", { id: "session-status" });
  root.append(h("p", h("a", { href: "#/sessions" }, "← all sessions")), status);
  const data = await api("GET", `/sessions/${encodeURIComponent(id)}`);
  if (!alive()) return;
  const scalars = {};
  const sections = [];
  for (const [name, value] of Object.entries(data ?? {})) {
    if (SHOWN_ELSEWHERE.has(name)) continue;
    if (value === null || typeof value !== "object") scalars[name] = value;
    else sections.push(card(label(name), anyValue(value)));
  }
  const segments = rowsOf(data?.segments ?? [], "segments");
  root.append(
    h("div.actions",
      data?.currentSegment ? h("button", { type: "button", id: "reflect-session", onclick: () => reflect(data.currentSegment, status) }, "Reflect current segment") : null,
      data?.status === "active" ? confirmButton("End session", "Click again to end it", async () => {
        try { const r = await api("DELETE", `/sessions/${encodeURIComponent(id)}`); say(status, `Session ended (${r?.wasLive ? "it was live" : "no live connection"}).`); } catch (e) { say(status, e.message, "error"); }
      }) : null,
    ),
    card(`session ${short(id, 24)}`, h("div", { id: "session-detail" }, anyValue(scalars))),
    card("activity", anyValue(data?.activity ?? {})),
    card("segments", table(segments, [
      { key: "id", render: (s) => h("code", s.id) },
      { key: "startedAt", label: "started", render: (s) => fmtTime(s.startedAt) },
      { key: "endedAt", label: "ended", render: (s) => fmtTime(s.endedAt) },
      { key: "endReason", label: "end reason" },
      { key: "reflectedAt", label: "reflected", render: (s) => fmtTime(s.reflectedAt) || (s.reflectError ? `failed: ${s.reflectError}` : "no") },
      { key: "reflect", label: "", render: (s) => h("button", { type: "button", onclick: () => reflect(s.id, status) }, "Reflect") },
    ], { empty: "No segments." })),
    h("div.grid", sections),
  );
  void navigate;
}

export async function render(root, ctx) {
  if (ctx.arg) return detail(root, ctx.arg, ctx);
  const statusFilter = STATUSES.includes(ctx.query.get("status")) ? ctx.query.get("status") : "active";
  const status = h("div", { id: "sessions-status" });
  const summary = h("div", { id: "sessions-summary" });
  const list = h("div", { id: "sessions" }, h("p.muted", "loading…"));
  const picker = select("status", STATUSES.map((s) => [s, s]), statusFilter);
  picker.addEventListener("change", () => ctx.navigate("sessions", null, { status: picker.value }));
  root.append(status,
    h("div.actions",
      field("Show", picker),
      h("button", { type: "button", id: "reflect-all", onclick: async () => {
        try { const r = await api("POST", "/sessions/reflect-all"); say(status, `Reflect queued for ${r?.pending ?? 0} unreflected session segment(s).`); } catch (e) { say(status, e.message, "error"); }
      } }, "Reflect all unreflected"),
      h("button", { type: "button", id: "cleanup-sessions", onclick: async () => {
        try { const r = await api("POST", "/sessions/cleanup"); say(status, `${r?.message ?? "Cleanup done"}: ${r?.ended ?? 0} ended, ${r?.orphanSegments ?? 0} orphan segment(s) closed.`); await load(); } catch (e) { say(status, e.message, "error"); }
      } }, "Clean up expired"),
    ),
    summary, card("sessions", list));

  async function load() {
    const data = await api("GET", "/sessions", { query: { status: statusFilter } });
    if (!ctx.alive()) return;
    replace(summary, data?.counts ? h("div.tiles", Object.entries(data.counts).map(([k, v]) => h("div.tile", { dataset: { stat: k } }, h("div.tile-value", String(v ?? "—")), h("div.tile-label", k)))) : null);
    replace(list, table(rowsOf(data, "sessions", "items"), [
      { key: "sessionId", label: "session", render: (s) => h("code", short(idOf(s), 14)) },
      { key: "key", render: (s) => s.keyName ?? s.key_name ?? (s.keyId ?? s.key_id ? short(s.keyId ?? s.key_id) : "master") },
      { key: "type" },
      { key: "status" },
      { key: "workspace", render: (s) => s.workspace ?? "" },
      { key: "mode", render: (s) => s.mode ?? "" },
      { key: "createdAt", label: "started", render: (s) => fmtTime(s.createdAt ?? s.created_at) },
      { key: "lastAccessedAt", label: "last activity", render: (s) => fmtTime(s.lastAccessedAt ?? s.last_activity_at) },
      { key: "calls", render: (s) => (s.activity ? `${s.activity.totalCalls ?? 0}${s.activity.lastTool ? ` (last: ${s.activity.lastTool})` : ""}` : "") },
      { key: "unreflected", render: (s) => s.unreflectedSegments ?? "" },
    ], { onRow: (s) => ctx.navigate("sessions", idOf(s)), empty: `No ${statusFilter === "all" ? "" : `${statusFilter} `}sessions.` }));
  }
  await load();
}
