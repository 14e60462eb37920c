// Every element of the console is built here, and data only ever becomes text nodes or
// attribute values: no innerHTML / insertAdjacentHTML / document.write anywhere, so a stored
// "<script>" or "<img onerror>" in a fragment is shown as the characters it is.

const SVG_NS = "http://www.w3.org/2000/svg";

function setProps(el, props) {
  for (const [name, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      el.setAttribute("class", value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "value" || name === "checked" || name === "selected" || name === "disabled") {
      el[name] = value;
    } else if (name === "href" && !String(value).startsWith("#")) {
      throw new Error("console links are in-app (#/...) only");
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

function appendAll(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** h("tag.class", {props}, ...children): an element; strings become text nodes. */
export function h(spec, props, ...children) {
  const [tag, ...classes] = spec.split(".");
  const el = document.createElement(tag || "div");
  if (classes.length) el.className = classes.join(" ");
  if (props && (typeof props !== "object" || props instanceof Node || Array.isArray(props))) {
    children.unshift(props);
    props = null;
  }
  setProps(el, props);
  appendAll(el, children);
  return el;
}

export function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, String(value));
  }
  appendAll(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function replace(el, ...children) {
  clear(el);
  appendAll(el, children);
  return el;
}

export function fmtTime(value) {
  if (!value) return "";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function fmtBytes(n) {
  if (typeof n !== "number") return String(n ?? "");
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function short(id, n = 8) {
  const s = String(id ?? "");
  return s.length > n + 2 ? `${s.slice(0, n)}…` : s;
}

export function preview(text, n = 140) {
  const s = String(text ?? "");
  return s.length > n ? `${s.slice(0, n)}…` : s;
}

const ISO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;

function scalar(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "number") return Number.isInteger(value) ? value.toLocaleString("en-US") : value.toFixed(3);
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value === "string" && ISO_TIME.test(value)) return fmtTime(value);
  return String(value);
}

/** A ratio field (…Rate, …_rate, avgRelevance-like 0..1 figures named rate) shown as a percent. */
function isRate(name, value) {
  return typeof value === "number" && value >= 0 && value <= 1 && /rate$/i.test(String(name));
}

function isScalar(value) {
  return value === null || value === undefined || ["string", "number", "boolean"].includes(typeof value);
}

/** A label from a field name: "apiCallsToday" / "api_calls_today" -> "api calls today". */
export function label(name) {
  return String(name).replace(/_/g, " ").replace(/([a-z0-9])([A-Z])/g, "$1 $2").toLowerCase();
}

/** A table of rows; columns [{key, label, render(row)}] or derived from the rows' scalar fields. */
export function table(rows, columns, { onRow, empty = "Nothing here yet.", rowClass } = {}) {
  rows = Array.isArray(rows) ? rows : [];
  if (!rows.length) return h("p.empty", empty);
  if (!columns) {
    const names = [];
    for (const row of rows.slice(0, 20)) {
      for (const [name, value] of Object.entries(row ?? {})) {
        if (!names.includes(name) && (isScalar(value) || Array.isArray(value))) names.push(name);
      }
    }
    columns = names.map((key) => ({ key }));
  }
  const head = h("tr", columns.map((c) => h("th", c.label ?? label(c.key))));
  const body = rows.map((row) => {
    const cells = columns.map((c) => {
      const value = c.render ? c.render(row) : row?.[c.key];
      if (value instanceof Node) return h("td", value);
      if (Array.isArray(value)) return h("td", value.map(scalar).join(", "));
      return h("td", typeof value === "object" && value !== null ? JSON.stringify(value) : scalar(value));
    });
    const tr = h("tr", { class: rowClass ? rowClass(row) : null }, cells);
    if (onRow) {
      tr.classList.add("clickable");
      tr.tabIndex = 0;
      tr.addEventListener("click", (event) => { if (!event.target.closest("button, input, select, a")) onRow(row); });
      tr.addEventListener("keydown", (event) => { if (event.key === "Enter") onRow(row); });
    }
    return tr;
  });
  return h("table", h("thead", head), h("tbody", body));
}

/** Any JSON value shown readably: scalars as a key/value grid, arrays of objects as tables. */
export function anyValue(value, depth = 0) {
  if (isScalar(value)) return h("span.value", scalar(value));
  if (Array.isArray(value)) {
    if (!value.length) return h("span.muted", "none");
    if (value.every(isScalar)) return h("span.value", value.map(scalar).join(", "));
    if (value.every((v) => v && typeof v === "object" && !Array.isArray(v))) return table(value);
    return h("pre.json", JSON.stringify(value, null, 2));
  }
  if (depth > 2) return h("pre.json", JSON.stringify(value, null, 2));
  const entries = Object.entries(value ?? {});
  if (!entries.length) return h("span.muted", "none");
  return h("dl.kv", entries.map(([k, v]) => [h("dt", label(k)), h("dd", isRate(k, v) ? h("span.value", `${(v * 100).toFixed(1)}%`) : anyValue(v, depth + 1))]));
}

export function card(title, ...children) {
  return h("section.card", h("h3", title), ...children);
}

export function tile(name, value, hint) {
  return h("div.tile", { dataset: { stat: name } }, h("div.tile-value", scalar(value)), h("div.tile-label", label(name)), hint ? h("div.tile-hint", hint) : null);
}

/** A button that asks again before it acts (no window.confirm: no native dialogs in the console). */
export function confirmButton(text, confirmText, action, { className = "danger" } = {}) {
  let armed = false;
  let timer = null;
  const button = h(`button.${className}`, { type: "button" }, text);
  button.addEventListener("click", async () => {
    if (!armed) {
      armed = true;
      button.textContent = confirmText;
      button.classList.add("armed");
      timer = setTimeout(() => { armed = false; button.textContent = text; button.classList.remove("armed"); }, 5000);
      return;
    }
    clearTimeout(timer);
    button.disabled = true;
    try { await action(); } finally { button.disabled = false; armed = false; button.textContent = text; button.classList.remove("armed"); }
  });
  return button;
}

/** A field: label + control. */
export function field(text, control) {
  return h("label.field", h("span", text), control);
}

export function select(name, options, value) {
  return h("select", { name }, options.map(([v, text]) => h("option", { value: v, selected: String(v) === String(value ?? "") }, text)));
}

/** Rows of an API answer that may be an array or an object holding one (items, fragments, ...). */
export function rowsOf(data, ...names) {
  if (Array.isArray(data)) return data;
  if (!data || typeof data !== "object") return [];
  for (const name of names) if (Array.isArray(data[name])) return data[name];
  const first = Object.values(data).find(Array.isArray);
  return first ?? [];
}
