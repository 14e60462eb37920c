// Sessions: GET /sessions (activity, unreflected count), a session's detail (search events,
// tool feedback), reflect one, end one, clean up expired ones, reflect every unreflected one.
import { api } from "../lib/api.js";
import { anyValue, card, confirmButton, fmtTime, h, replace, rowsOf, short, table } from "../lib/dom.js";

function say(box, text, kind = "ok") { replace(box, h(`p.${kind}`, { role: kind === "error" ? "alert" : "status" }, text)); }

async function detail(root, id, { navigate, alive }) {
  const status = h("div", { id: "session-status" });
  root.append(h("p", h("a", { href: "#/sessions" }, "← all sessions")), status);
  const data = await api("GET", `/sessions/${encodeURIComponent(id)}`);
  if (!alive()) return;
  const session = data?.session ?? data;
  root.append(
    h("div.actions",
      h("button", { type: "button", id: "reflect-session", onclick: async () => {
        try { const r = await api("POST", `/sessions/${encodeURIComponent(id)}/reflect`); say(status, r?.alreadyReflected ? "Reflect queued (it had been reflected before)." : "Reflect queued."); } catch (e) { say(status, e.message, "error"); }
      } }, "Reflect now"),
      confirmButton("End session", "Click again to end it", async () => {
        try { await api("DELETE", `/sessions/${encodeURIComponent(id)}`); say(status, "Session ended."); } catch (e) { say(status, e.message, "error"); }
      }),
    ),
    card(`session ${short(id, 16)}`, h("div", { id: "session-detail" }, anyValue(session))),
  );

}

export async function render(root, ctx) {
  if (ctx.arg) return detail(root, ctx.arg, ctx);
  const status = h("div", { id: "sessions-status" });
  const summary = h("div", { id: "sessions-summary" });
  const list = h("div", { id: "sessions" }, h("p.muted", "loading…"));
  root.append(status,
    h("div.actions",
      h("button", { type: "button", id: "reflect-all", onclick: async () => {
        try { const r = await api("POST", "/sessions/reflect-all"); say(status, `Reflect queued for ${r?.pending ?? "the"} unreflected session(s).`); } catch (e) { say(status, e.message, "error"); }
      } }, "Reflect all unreflected"),
      h("button", { type: "button", id: "cleanup-sessions", onclick: async () => {
        try { const r = await api("POST", "/sessions/cleanup"); say(status, `Cleanup done: ${JSON.stringify(r)}`); await load(); } catch (e) { say(status, e.message, "error"); }
      } }, "Clean up expired"),
    ),
    summary, card("sessions", list));

  async function load() {
    const data = await api("GET", "/sessions");
    if (!ctx.alive()) return;
    const rows = rowsOf(data, "sessions", "items");
    const scalars = Array.isArray(data) ? {} : Object.fromEntries(Object.entries(data ?? {}).filter(([, v]) => v === null || typeof v !== "object"));
    replace(summary, Object.keys(scalars).length ? anyValue(scalars) : null);
    replace(list, table(rows, [
      { key: "id", render: (s) => h("code", short(s.id ?? s.session_id ?? s.sessionId, 14)) },
      { key: "key", render: (s) => s.key_name ?? s.keyName ?? (s.key_id ? short(s.key_id) : "master") },
      { key: "transport", render: (s) => s.transport ?? "" },
      { key: "started", render: (s) => fmtTime(s.created_at ?? s.started_at ?? s.startedAt) },
      { key: "last activity", render: (s) => fmtTime(s.last_activity_at ?? s.last_seen_at ?? s.lastActivity ?? s.updated_at) },
      { key: "activity", render: (s) => { const a = s.activity ?? s.tool_calls ?? s.toolCalls; return a && typeof a === "object" ? JSON.stringify(a) : a ?? ""; } },
      { key: "ended", render: (s) => fmtTime(s.ended_at ?? s.endedAt) },
      { key: "reflected", render: (s) => (s.reflected_at ?? s.reflectedAt ? "yes" : "no") },
    ], { onRow: (s) => ctx.navigate("sessions", s.id ?? s.session_id ?? s.sessionId), empty: "No sessions." }));
  }
  await load();
}
