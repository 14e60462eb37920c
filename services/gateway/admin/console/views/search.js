// Search analytics: GET /memory/search-events?days=N (total searches, failed queries,
// feedback statistics): the questions agents asked and the ones memory could not answer.
import { api } from "../lib/api.js";
import { anyValue, card, field, h, label, replace, select } from "../lib/dom.js";

const DAYS = [1, 7, 30, 90];

export async function render(root, { query, navigate, alive }) {
  const days = DAYS.includes(Number(query.get("days"))) ? Number(query.get("days")) : 7;
  const picker = select("days", DAYS.map((d) => [d, d === 1 ? "last day" : `last ${d} days`]), days);
  picker.addEventListener("change", () => navigate("search", null, { days: picker.value }));
  const box = h("div", { id: "search-events" }, h("p.muted", "loading…"));
  root.append(h("div.filters", field("Window", picker)), box);
  const data = await api("GET", "/memory/search-events", { query: { days } });
  if (!alive()) return;
  const scalars = {};
  const lists = [];
  const sections = [];
  for (const [name, value] of Object.entries(data ?? {})) {
    if (value === null || typeof value !== "object") scalars[name] = value;
    else if (Array.isArray(value)) lists.push(card(label(name), anyValue(value)));  // tables: the full width
    else sections.push(card(label(name), anyValue(value)));
  }
  replace(box, card(`the last ${days} day(s)`, anyValue(scalars)), lists, h("div.grid", sections));
}
