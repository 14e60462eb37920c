// Memory browser: GET /memory/overview and GET /memory/fragments (topic, type, key_id,
// workspace, page, limit); a row opens the fragment's detail. The filters live in the URL
// (#/memory?topic=...), so a filtered view can be bookmarked for this tab or reloaded.
import { api } from "../lib/api.js";
import { transferCard } from "./transfer.js";
import { anyValue, card, field, fmtTime, h, label, preview, replace, rowsOf, select, short, table } from "../lib/dom.js";

const TYPES = ["fact", "decision", "error", "preference", "procedure", "relation", "episode"];
const LIMITS = [20, 50, 100];

function overviewView(overview) {
  const summary = {};
  const rest = {};
  for (const [name, value] of Object.entries(overview ?? {})) {
    (value === null || typeof value !== "object" ? summary : rest)[name] = value;
  }
  return [anyValue(summary), h("div.grid", Object.entries(rest).map(([name, value]) => card(label(name), anyValue(value))))];
}

export async function render(root, { query, navigate, alive }) {
  const filters = {
    topic: query.get("topic") ?? "",
    type: query.get("type") ?? "",
    key_id: query.get("key_id") ?? "",
    workspace: query.get("workspace") ?? "",
    page: Math.max(1, Number(query.get("page") ?? 1) || 1),
    limit: Math.min(100, Math.max(1, Math.trunc(Number(query.get("limit"))) || 20)),
  };
  const keys = await api("GET", "/keys").catch(() => []);
  const keyNames = new Map(keys.map((k) => [k.id, k.name]));

  const topic = h("input", { name: "topic", value: filters.topic, placeholder: "any" });
  const type = select("type", [["", "any"], ...TYPES.map((t) => [t, t])], filters.type);
  const key = select("key_id", [["", "any"], ["master", "the master key's own"], ...keys.map((k) => [k.id, k.name])], filters.key_id);
  const workspace = h("input", { name: "workspace", value: filters.workspace, placeholder: "any" });
  const limit = select("limit", [...new Set([...LIMITS, filters.limit])].sort((a, b) => a - b).map((n) => [n, String(n)]), filters.limit);
  const form = h("form.filters", { id: "fragment-filters" },
    field("Topic", topic), field("Type", type), field("Key", key), field("Workspace", workspace), field("Per page", limit),
    h("button.primary", { type: "submit" }, "Filter"),
    h("button", { type: "button", onclick: () => navigate("memory") }, "Clear"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    navigate("memory", null, { topic: topic.value.trim(), type: type.value, key_id: key.value, workspace: workspace.value.trim(), limit: limit.value, page: 1 });
  });

  const overviewBox = h("div", { id: "memory-overview" }, h("p.muted", "loading…"));
  const results = h("div", { id: "fragments" }, h("p.muted", "loading…"));
  const pager = h("div.pager", { id: "pager" });
  root.append(
    h("details.overview", h("summary", "Overview: types, topics, quality, superseded, recent activity"), overviewBox),
    card("fragments", form, results, pager),
    transferCard(filters, keys),
  );

  api("GET", "/memory/overview")
    .then((overview) => alive() && replace(overviewBox, overviewView(overview)))
    .catch((error) => alive() && replace(overviewBox, h("div.error", `overview: ${error.message}`)));

  const query_ = Object.fromEntries(Object.entries(filters).filter(([, v]) => v !== ""));
  const data = await api("GET", "/memory/fragments", { query: query_ });
  if (!alive()) return;
  const rows = rowsOf(data, "items", "fragments");
  replace(results, table(rows, [
    { key: "id", render: (r) => h("code", short(r.id, 10)) },
    { key: "topic" },
    { key: "type" },
    { key: "key", render: (r) => (r.key_id ? (r.key_name ?? keyNames.get(r.key_id) ?? short(r.key_id)) : "master") },
    { key: "workspace", render: (r) => r.workspace ?? "" },
    { key: "importance", render: (r) => (typeof r.importance === "number" ? r.importance.toFixed(2) : r.importance ?? "") },
    { key: "created_at", label: "created", render: (r) => fmtTime(r.created_at) },
    { key: "content", render: (r) => h("span.content-preview", preview(r.preview ?? r.content, 160)) },
  ], { onRow: (r) => navigate("fragment", r.id), empty: "No fragment matches these filters." }));

  const total = typeof data?.total === "number" ? data.total : null;
  const pages = total === null ? null : Math.max(1, Math.ceil(total / filters.limit));
  const go = (page) => navigate("memory", null, { ...query_, page });
  replace(pager,
    h("button", { type: "button", id: "prev-page", disabled: filters.page <= 1, onclick: () => go(filters.page - 1) }, "← Previous"),
    h("span", { id: "page-info" }, total === null ? `page ${filters.page}` : `page ${filters.page} of ${pages} · ${total} fragments`),
    h("button", { type: "button", id: "next-page", disabled: pages !== null ? filters.page >= pages : rows.length < filters.limit, onclick: () => go(filters.page + 1) }, "Next →"),
  );
}
