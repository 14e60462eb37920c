// Export and import from the memory browser: GET /export (JSON Lines of one key's or every
// tenant's fragments, a topic narrowing it) saved as a file, and POST /import of a file
// (JSON Lines from an export, or a JSON array / {fragments: [...]}) through the write path.
import { api } from "../lib/api.js";
import { card, field, h, replace, select } from "../lib/dom.js";

function say(box, text, kind = "ok") { replace(box, h(`p.${kind}`, { role: kind === "error" ? "alert" : "status" }, text)); }

/** Items of an import file: a JSON array, {fragments: [...]}, or one JSON object per line. */
export function parseImport(text) {
  const trimmed = text.trim();
  if (trimmed.startsWith("[") || trimmed.startsWith("{\"fragments\"")) {
    const parsed = JSON.parse(trimmed);
    return Array.isArray(parsed) ? parsed : parsed.fragments;
  }
  return trimmed.split(/\r?\n/).filter((line) => line.trim()).map((line, i) => {
    try { return JSON.parse(line); } catch { throw new Error(`line ${i + 1} is not JSON`); }
  });
}

function save(blob, name) {
  // A download link made here and clicked at once (lib/dom.js's h() admits in-app links only).
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 30_000);
}

export function transferCard(filters, keys) {
  const status = h("div", { id: "transfer-status" });
  const keyId = filters.key_id && filters.key_id !== "master" ? filters.key_id : "";
  const keyName = keys.find((k) => k.id === keyId)?.name;
  const exportButton = h("button", { type: "button", id: "export" },
    `Export ${keyName ? `key ${keyName}` : "every tenant"}${filters.topic ? `, topic “${filters.topic}”` : ""} (JSON Lines)`);
  exportButton.addEventListener("click", async () => {
    exportButton.disabled = true;
    try {
      const response = await api("GET", "/export", { query: { key_id: keyId, topic: filters.topic }, raw: true });
      const blob = await response.blob();
      const lines = (await blob.text()).split("\n").filter(Boolean).length;
      save(blob, `engram-export-${keyId || "all"}${filters.topic ? `-${filters.topic}` : ""}.jsonl`);
      say(status, `Exported ${lines} fragment(s).`);
    } catch (error) { say(status, `Export failed: ${error.message}`, "error"); } finally { exportButton.disabled = false; }
  });

  const file = h("input", { type: "file", name: "import_file", accept: ".jsonl,.json,.ndjson,application/json" });
  const into = select("import_key", [["", "each item's own key (as exported)"], ...keys.map((k) => [k.id, `key ${k.name}`])], "");
  const importForm = h("form.filters", { id: "import-form" }, field("File", file), field("Into", into), h("button", { type: "submit" }, "Import"));
  importForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const chosen = file.files?.[0];
    if (!chosen) { say(status, "Choose a file first.", "error"); return; }
    try {
      const items = parseImport(await chosen.text());
      const result = await api("POST", "/import", { body: items, query: { key_id: into.value } });
      const failed = (result.results ?? []).filter((r) => r.success === false || r.error).slice(0, 5)
        .map((r) => `#${r.index}: ${r.error ?? "failed"}`);
      say(status, `Imported ${result.imported} of ${result.total}: ${result.existing} already there, ${result.duplicates} duplicate(s), ${result.failed} failed.${failed.length ? ` ${failed.join("; ")}` : ""}`,
        result.failed ? "error" : "ok");
    } catch (error) { say(status, `Import failed: ${error.message}`, "error"); }
  });
  return card("export / import",
    h("p.muted", "Export takes the key and (exact) topic filters above; import goes through the write path (validation, secret screening, embeddings)."),
    h("div.actions", exportButton), importForm, status);
}
