// Engram admin console: a hash-routed single page over the admin REST API (plain ES modules).
import { masterKey, whenUnauthorized } from "./lib/api.js";
import { h, replace } from "./lib/dom.js";
import * as dashboard from "./views/dashboard.js";
import * as fragment from "./views/fragment.js";
import * as graph from "./views/graph.js";
import * as keys from "./views/keys.js";
import * as login from "./views/login.js";
import * as logs from "./views/logs.js";
import * as maintenance from "./views/maintenance.js";
import * as memory from "./views/memory.js";
import * as search from "./views/search.js";
import * as sessions from "./views/sessions.js";

const VIEWS = {
  dashboard: { module: dashboard, title: "Dashboard", nav: true },
  keys: { module: keys, title: "Keys & groups", nav: true },
  memory: { module: memory, title: "Memory", nav: true },
  fragment: { module: fragment, title: "Fragment", nav: false, parent: "memory" },
  search: { module: search, title: "Search analytics", nav: true },
  sessions: { module: sessions, title: "Sessions", nav: true },
  logs: { module: logs, title: "Logs", nav: true },
  graph: { module: graph, title: "Graph", nav: true },
  maintenance: { module: maintenance, title: "Maintenance", nav: true },
};

const app = document.getElementById("app");
let cleanup = null;
let generation = 0;

function parseHash() {
  const raw = window.location.hash.replace(/^#\/?/, "");
  const [path, queryString] = raw.split("?");
  const [name, ...rest] = path.split("/");
  return { name: name || "dashboard", arg: rest.length ? decodeURIComponent(rest.join("/")) : null, query: new URLSearchParams(queryString ?? "") };
}

export function navigate(name, arg, query) {
  const qs = query ? new URLSearchParams(Object.entries(query).filter(([, v]) => v !== "" && v != null)).toString() : "";
  window.location.hash = `#/${name}${arg != null ? `/${encodeURIComponent(arg)}` : ""}${qs ? `?${qs}` : ""}`;
}

function layout(active) {
  const nav = h("nav.sidebar",
    h("div.brand", "Engram", h("span.muted", " admin")),
    Object.entries(VIEWS).filter(([, v]) => v.nav).map(([name, v]) =>
      h("a", { href: `#/${name}`, class: name === active ? "active" : null, "aria-current": name === active ? "page" : null, dataset: { view: name } }, v.title)),
    h("button.logout", { type: "button", id: "logout", onclick: () => { masterKey.clear(); navigate("login"); } }, "Log out"),
  );
  const main = h("main.content", { id: "view" });
  replace(app, h("div.shell", nav, main));
  return main;
}

function showError(root, error) {
  root.append(h("div.error", { role: "alert" }, error?.message ?? String(error)));
}

async function route() {
  const mine = ++generation;
  if (cleanup) { try { cleanup(); } catch { /* a view's timers are gone either way */ } cleanup = null; }
  const { name, arg, query } = parseHash();
  if (!masterKey.get() || name === "login") {
    if (name !== "login") { navigate("login"); return; }
    replace(app, h("div.login-page", { id: "view", dataset: { view: "login" } }));
    await login.render(app.firstChild, { navigate });
    return;
  }
  const view = VIEWS[name] ?? VIEWS.dashboard;
  const root = layout(view.parent ?? name);
  root.dataset.view = name in VIEWS ? name : "dashboard";
  root.append(h("h1", view.title));
  const ctx = {
    arg, query, navigate,
    alive: () => mine === generation,
    error: (e) => showError(root, e),
  };
  try {
    const result = await view.module.render(root, ctx);
    if (typeof result === "function") {
      if (mine === generation) cleanup = result; else result();
    }
  } catch (error) {
    if (mine === generation) showError(root, error);
  }
}

whenUnauthorized(() => navigate("login"));
window.addEventListener("hashchange", route);
route();
