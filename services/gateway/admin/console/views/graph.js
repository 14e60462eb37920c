// The knowledge graph: GET /memory/graph?topic=&limit= (nodes + edges), drawn as SVG with the
// console's own force layout. Wheel zooms, dragging the background pans, a node opens its
// fragment. Labels and tooltips are text nodes: a fragment's markup is never parsed.
import { api } from "../lib/api.js";
import { field, h, preview, replace, rowsOf, select, short, svg } from "../lib/dom.js";
import { fitBox, forceLayout } from "../lib/force.js";

const LIMITS = [50, 100, 200, 500];
const TYPES = ["fact", "decision", "error", "preference", "procedure", "relation", "episode"];

function endpoints(edge) {
  return [edge.from_id ?? edge.source ?? edge.from ?? edge.fromId, edge.to_id ?? edge.target ?? edge.to ?? edge.toId];
}

function interactive(svgEl, box) {
  let view = [...box];
  const apply = () => svgEl.setAttribute("viewBox", view.join(" "));
  svgEl.addEventListener("wheel", (event) => {
    event.preventDefault();
    const rect = svgEl.getBoundingClientRect();
    const fx = (event.clientX - rect.left) / rect.width;
    const fy = (event.clientY - rect.top) / rect.height;
    const scale = event.deltaY > 0 ? 1.15 : 1 / 1.15;
    const w = view[2] * scale;
    const hh = view[3] * scale;
    view = [view[0] + (view[2] - w) * fx, view[1] + (view[3] - hh) * fy, w, hh];
    apply();
  }, { passive: false });
  let drag = null;
  svgEl.addEventListener("pointerdown", (event) => {
    if (event.target.closest("g.node")) return;
    drag = { x: event.clientX, y: event.clientY, view: [...view] };
    svgEl.setPointerCapture(event.pointerId);
  });
  svgEl.addEventListener("pointermove", (event) => {
    if (!drag) return;
    const rect = svgEl.getBoundingClientRect();
    view = [drag.view[0] - ((event.clientX - drag.x) * view[2]) / rect.width, drag.view[1] - ((event.clientY - drag.y) * view[3]) / rect.height, view[2], view[3]];
    apply();
  });
  svgEl.addEventListener("pointerup", () => { drag = null; });
  apply();
}

export async function render(root, { query, navigate, alive }) {
  const topic = h("input", { name: "topic", value: query.get("topic") ?? "", placeholder: "any topic" });
  const limitValue = LIMITS.includes(Number(query.get("limit"))) ? Number(query.get("limit")) : 100;
  const limit = select("limit", LIMITS.map((n) => [n, `${n} nodes`]), limitValue);
  const form = h("form.filters", { id: "graph-form" }, field("Topic", topic), field("Size", limit), h("button.primary", { type: "submit" }, "Draw"));
  form.addEventListener("submit", (e) => { e.preventDefault(); navigate("graph", null, { topic: topic.value.trim(), limit: limit.value }); });
  const stage = h("div.graph-stage", { id: "graph" }, h("p.muted", "loading…"));
  const side = h("aside.graph-side", { id: "graph-node" }, h("p.muted", "Click a node to see its fragment."));
  root.append(form, h("div.graph-wrap", stage, side));

  const data = await api("GET", "/memory/graph", { query: { topic: topic.value.trim(), limit: limitValue } });
  if (!alive()) return;
  const nodes = rowsOf(data?.nodes ?? data, "nodes");
  const index = new Map(nodes.map((n, i) => [n.id, i]));
  const edges = rowsOf(data?.edges ?? [], "edges")
    .map((e) => { const [a, b] = endpoints(e); return { edge: e, a: index.get(a), b: index.get(b) }; })
    .filter((e) => e.a !== undefined && e.b !== undefined);
  if (!nodes.length) { replace(stage, h("p.empty", "No fragments to draw for this filter.")); return; }

  const pos = forceLayout(nodes.length, edges.map((e) => [e.a, e.b]));
  const lines = edges.map(({ edge, a, b }) => {
    const rel = String(edge.relation_type ?? edge.relationType ?? edge.relation ?? "related");
    return svg("line", { class: `edge rel-${rel.replace(/[^a-z_]/gi, "")}`, x1: pos[a].x, y1: pos[a].y, x2: pos[b].x, y2: pos[b].y, "data-relation": rel },
      svg("title", null, rel));
  });
  const circles = nodes.map((n, i) => {
    const type = TYPES.includes(n.type) ? n.type : "other";
    const importance = typeof n.importance === "number" ? n.importance : 0.5;
    const g = svg("g", { class: `node type-${type}`, transform: `translate(${pos[i].x.toFixed(1)},${pos[i].y.toFixed(1)})`, tabindex: 0, "data-id": n.id },
      svg("circle", { r: (6 + importance * 10).toFixed(1) }),
      svg("text", { x: 14, y: 4 }, preview(n.label ?? n.content ?? n.topic ?? short(n.id), 28)),
      svg("title", null, `${n.type ?? ""} · ${n.topic ?? ""}\n${preview(n.content ?? n.label ?? "", 300)}`),
    );
    const open = () => replace(side,
      h("h3", `${n.type ?? "fragment"} · ${n.topic ?? ""}`),
      h("pre.content", { id: "graph-node-content" }, n.content ?? n.label ?? ""),
      h("p.muted", `importance ${importance.toFixed(2)} · ${edges.filter((e) => e.a === i || e.b === i).length} link(s)`),
      h("button", { type: "button", id: "open-fragment", onclick: () => navigate("fragment", n.id) }, "Open fragment"),
    );
    g.addEventListener("click", open);
    g.addEventListener("keydown", (event) => { if (event.key === "Enter") open(); });
    return g;
  });
  const svgEl = svg("svg", { class: "graph", role: "img", "aria-label": `knowledge graph: ${nodes.length} fragments, ${edges.length} links`, preserveAspectRatio: "xMidYMid meet" },
    svg("g", { class: "edges" }, lines), svg("g", { class: "nodes" }, circles));
  const types = [...new Set(nodes.map((n) => (TYPES.includes(n.type) ? n.type : "other")))];
  const relations = [...new Set(edges.map((e) => String(e.edge.relation_type ?? e.edge.relationType ?? "related")))];
  replace(stage,
    svgEl,
    h("div.legend", { id: "graph-legend" },
      h("span.muted", `${nodes.length} fragments · ${edges.length} links · `),
      types.map((t) => h(`span.swatch.type-${t}`, t)),
      relations.length ? h("span.muted", ` · relations: ${relations.join(", ")}`) : null),
  );
  interactive(svgEl, fitBox(pos));
}
