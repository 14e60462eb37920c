// Logs: GET /logs/files (with sizes), /logs/read (file, tail, level, search) and /logs/stats
// (counts per level, recent errors, disk usage). "Follow" re-reads the tail every 3 s.
import { api } from "../lib/api.js";
import { anyValue, card, field, fmtBytes, h, replace, rowsOf, select } from "../lib/dom.js";

const LEVELS = ["", "debug", "info", "warning", "error", "critical"];
const TAILS = [100, 200, 500, 1000];
const FOLLOW_MS = 3000;

function levelOf(line) {
  if (line && typeof line === "object" && line.level) return String(line.level).toLowerCase();
  const m = /\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b/.exec(String(line));
  return m ? (m[1] === "WARN" ? "warning" : m[1].toLowerCase()) : "";
}

function lineText(line) {
  if (typeof line === "string") return line;
  if (line && typeof line === "object") {
    if ("message" in line) return [line.timestamp, line.level ? String(line.level).toUpperCase() : null, line.message].filter(Boolean).join(" ");
    return line.line ?? line.text ?? JSON.stringify(line);
  }
  return String(line);
}

export async function render(root, { alive }) {
  const filesData = await api("GET", "/logs/files");
  if (!alive()) return;
  const files = rowsOf(filesData, "files");
  // A deployment that logs to stdout (no LOG_DIR) answers enabled: false and says where they are.
  const note = filesData && typeof filesData.message === "string" && filesData.message ? filesData.message : null;
  const fileName = (f) => (typeof f === "string" ? f : f.name ?? f.file);
  const fileSelect = select("file", files.map((f) => [fileName(f), typeof f === "string" ? f : `${fileName(f)} (${fmtBytes(f.size ?? f.bytes)})`]), fileName(files.find((f) => /gateway/.test(fileName(f))) ?? files[0] ?? ""));
  const tail = select("tail", TAILS.map((n) => [n, `last ${n} lines`]), 200);
  const level = select("level", LEVELS.map((l) => [l, l || "any level"]), "");
  const search = h("input", { name: "search", placeholder: "text to find" });
  const follow = h("input", { type: "checkbox", name: "follow" });
  const output = h("div.log", { id: "log-lines", role: "log" });
  const info = h("p.muted", { id: "log-info" });
  const statsBox = h("div", { id: "log-stats" });
  const form = h("form.filters", { id: "log-form" },
    field("File", fileSelect), field("Tail", tail), field("Level", level), field("Search", search),
    h("label.check", follow, "follow"), h("button.primary", { type: "submit" }, "Read"));

  async function read({ quiet = false } = {}) {
    if (!fileSelect.value) return;
    if (!quiet) { info.textContent = "reading…"; replace(output); }  // a follow re-read keeps the view steady
    const data = await api("GET", "/logs/read", { query: { file: fileSelect.value, tail: tail.value, level: level.value, search: search.value.trim() } });
    if (!alive()) return;
    const lines = rowsOf(data, "lines", "entries");
    replace(output, lines.length ? lines.map((l) => h(`div.line.${levelOf(l) || "plain"}`, lineText(l))) : h("p.empty", "No line matches."));
    const counts = data && typeof data.filtered === "number" ? ` · ${data.filtered} of the last ${data.total} entries match` : "";
    info.textContent = `${lines.length} line(s) shown${counts}`;
    output.scrollTop = output.scrollHeight;
  }
  form.addEventListener("submit", (e) => { e.preventDefault(); read().catch((err) => replace(output, h("div.error", err.message))); });
  if (note) root.append(h("p.notice", { id: "logs-note" }, note));
  root.append(card("read", form, info, output), card("statistics", statsBox));
  api("GET", "/logs/stats").then((s) => alive() && replace(statsBox, anyValue(s))).catch((e) => alive() && replace(statsBox, h("div.error", e.message)));
  if (files.length) await read();
  const timer = setInterval(() => { if (follow.checked) read({ quiet: true }).catch(() => {}); }, FOLLOW_MS);
  return () => clearInterval(timer);
}
