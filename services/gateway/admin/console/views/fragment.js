// One fragment: its content (always as text), metadata, versions (amend history and the
// superseded chain) and links; amend or forget it from here.
import { api } from "../lib/api.js";
import { anyValue, card, confirmButton, field, fmtTime, h, preview, replace, rowsOf, select, short, table } from "../lib/dom.js";

const TYPES = ["fact", "decision", "error", "preference", "procedure", "relation", "episode"];
const SHOWN_ELSEWHERE = new Set(["content", "versions", "history", "links", "linked", "fragment"]);

export const paths = {
  detail: (id) => `/memory/fragments/${encodeURIComponent(id)}`,
  amend: (id) => `/memory/fragments/${encodeURIComponent(id)}`,
  forget: (id) => `/memory/fragments/${encodeURIComponent(id)}`,
};

function versionsView(versions) {
  if (!versions.length) return h("p.empty", "No earlier versions: this fragment was never amended or superseded.");
  return h("ol.versions", { id: "versions" }, versions.map((v) => h("li.version",
    h("div.version-meta", [v.version != null ? `version ${v.version}` : null, fmtTime(v.created_at ?? v.changed_at), v.changed_by ? `by ${v.changed_by}` : null, v.type, v.topic, v.id ? short(v.id, 10) : null].filter(Boolean).join(" · ")),
    h("pre.content", v.content ?? v.old_content ?? JSON.stringify(v)),
  )));
}

function linksView(links, id, navigate) {
  return table(links, [
    { key: "relation", render: (l) => l.relation_type ?? l.relationType ?? l.relation ?? "" },
    { key: "direction", render: (l) => l.direction ?? (l.from_id === id ? "out" : l.to_id === id ? "in" : "") },
    { key: "other", render: (l) => h("code", short(l.other_id ?? l.id ?? (l.from_id === id ? l.to_id : l.from_id), 10)) },
    { key: "weight", render: (l) => (typeof l.weight === "number" ? l.weight.toFixed(2) : l.weight ?? "") },
    { key: "content", render: (l) => h("span.content-preview", preview(l.content ?? l.preview ?? "", 120)) },
  ], {
    onRow: (l) => navigate("fragment", l.other_id ?? l.id ?? (l.from_id === id ? l.to_id : l.from_id)),
    empty: "No links.",
  });
}

function chainCard(title, lists, navigate) {
  const parts = Object.entries(lists).filter(([, rows]) => Array.isArray(rows) && rows.length);
  if (!parts.length) return null;
  return card(title, parts.map(([name, rows]) => [h("h4", name), table(rows, [
    { key: "id", render: (r) => h("code", short(r.id, 12)) }, { key: "type" },
    { key: "created_at", label: "created", render: (r) => fmtTime(r.created_at) },
    { key: "content", render: (r) => h("span.content-preview", preview(r.content, 160)) },
  ], { onRow: (r) => navigate("fragment", r.id) })]));
}

function amendForm(fragment, done, status) {
  const content = h("textarea", { name: "content", rows: 4, maxlength: 4000 });
  content.value = fragment.content ?? "";
  const topic = h("input", { name: "topic", value: fragment.topic ?? "" });
  const type = select("type", TYPES.map((t) => [t, t]), fragment.type ?? "fact");
  const importance = h("input", { name: "importance", type: "number", min: 0, max: 1, step: "any", value: typeof fragment.importance === "number" ? Number(fragment.importance.toFixed(4)) : "" });
  const form = h("form.stack-form", { id: "amend-form" },
    field("Content", content), field("Topic", topic), field("Type", type), field("Importance", importance),
    h("button.primary", { type: "submit" }, "Amend"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = {};
    if (content.value !== (fragment.content ?? "")) body.content = content.value;
    if (topic.value.trim() && topic.value.trim() !== fragment.topic) body.topic = topic.value.trim();
    if (type.value !== fragment.type) body.type = type.value;
    if (importance.value !== "" && Math.abs(Number(importance.value) - (fragment.importance ?? -1)) > 1e-4) body.importance = Number(importance.value);
    if (!Object.keys(body).length) { replace(status, h("p.muted", "Nothing changed.")); return; }
    try {
      await api("PATCH", paths.amend(fragment.id), { body });
      await done("Amended.");
    } catch (error) {
      replace(status, h("p.error", { role: "alert" }, `Amend failed: ${error.message}`));
    }
  });
  return form;
}

export async function render(root, { arg, navigate, alive }) {
  const id = arg;
  const status = h("div", { id: "fragment-status" });
  const body = h("div", { id: "fragment-detail" }, h("p.muted", "loading…"));
  root.append(h("p", h("a", { href: "#/memory" }, "← back to the memory browser")), status, body);

  async function load(message) {
    const data = await api("GET", paths.detail(id));
    if (!alive()) return;
    const fragment = data?.fragment ?? data;
    const versions = rowsOf(data?.versions ?? data?.history ?? fragment?.versions ?? [], "versions", "history");
    const links = rowsOf(data?.links ?? fragment?.links ?? fragment?.linked ?? [], "links");
    const meta = Object.fromEntries(Object.entries(fragment ?? {}).filter(([k]) => !SHOWN_ELSEWHERE.has(k)));
    const force = h("input", { type: "checkbox", name: "force" });
    replace(body,
      card(`fragment ${short(fragment.id ?? id, 12)}`,
        h("pre.content", { id: "fragment-content" }, fragment.content ?? ""),
        anyValue(meta),
      ),
      card("versions", versionsView(versions)),
      card("links", h("div", { id: "links" }, linksView(links, fragment.id ?? id, navigate))),
      chainCard("supersession", { "superseded by (newer)": data?.superseded_by_chain, "supersedes (older)": data?.supersedes }, navigate),
      data?.causal && Object.values(data.causal).some((v) => Array.isArray(v) && v.length) ? card("causal chain", anyValue(data.causal)) : null,
      card("amend", amendForm(fragment, load, status)),
      card("forget",
        h("p.muted", "Deletes the fragment and its links. Permanent-tier fragments need force."),
        h("label.check", force, "force (permanent tier too)"),
        confirmButton("Forget this fragment", "Click again to forget", async () => {
          try {
            const result = await api("DELETE", paths.forget(id), { query: { force: force.checked ? "true" : null } });
            const kept = result && (result.deleted === 0 || result.protected);
            if (kept) { replace(status, h("p.error", { role: "alert" }, result.reason ?? result.error ?? "Not deleted.")); return; }
            replace(body, h("p.ok", { role: "status", id: "forgotten" }, "Forgotten."));
          } catch (error) {
            replace(status, h("p.error", { role: "alert" }, `Forget failed: ${error.message}`));
          }
        }),
      ),
    );
    if (message) replace(status, h("p.ok", { role: "status" }, message));
  }
  await load();
}
