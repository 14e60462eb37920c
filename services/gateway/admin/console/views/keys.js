// Keys and groups: create (the raw key is shown once, here, and kept nowhere), activate /
// deactivate, daily limit, default workspace, default mode, delete; groups and their members.
import { api } from "../lib/api.js";
import { card, confirmButton, field, fmtTime, h, replace, select, short, table } from "../lib/dom.js";

const MODES = ["recall-only", "write-only", "onboarding", "audit"];
const PERMISSIONS = ["read", "write", "admin"];

function numberOrNull(input) {
  const text = input.value.trim();
  return text === "" ? null : Number(text);
}

function notice(box, text, kind = "ok") {
  replace(box, h(`p.${kind}`, { role: "status" }, text));
}

function createForm(onCreated, status) {
  const name = h("input", { name: "name", required: true, maxlength: 200, placeholder: "e.g. claude-code-laptop" });
  const perms = PERMISSIONS.map((p) => h("label.check", h("input", { type: "checkbox", name: "perm", value: p, checked: p !== "admin" }), p));
  const workspace = h("input", { name: "default_workspace", maxlength: 200, placeholder: "none" });
  const mode = select("default_mode", [["", "none"], ...MODES.map((m) => [m, m])], "");
  const daily = h("input", { name: "daily_limit", type: "number", min: 0, placeholder: "unlimited" });
  const quota = h("input", { name: "fragment_limit", type: "number", min: 0, placeholder: "unlimited" });
  const form = h("form.inline-form", { id: "create-key" },
    field("Name", name), h("div.field", h("span", "Permissions"), h("div.checks", perms)),
    field("Default workspace", workspace), field("Default mode", mode),
    field("Daily call limit", daily), field("Fragment limit", quota),
    h("button.primary", { type: "submit" }, "Create key"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = {
      name: name.value.trim(),
      permissions: perms.map((l) => l.firstChild).filter((i) => i.checked).map((i) => i.value),
      default_workspace: workspace.value.trim() || null,
      default_mode: mode.value || null,
      daily_limit: numberOrNull(daily),
      fragment_limit: numberOrNull(quota),
    };
    try {
      const created = await api("POST", "/keys", { body });
      form.reset();
      onCreated(created);
    } catch (error) {
      notice(status, `Could not create the key: ${error.message}`, "error");
    }
  });
  return form;
}

function rawKeyNotice(created) {
  const value = h("code", { id: "raw-key" }, created.raw_key);
  const copy = h("button", { type: "button" }, "Copy");
  copy.addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(created.raw_key); copy.textContent = "Copied"; } catch { copy.textContent = "Select and copy it by hand"; }
  });
  return h("div.raw-key", { id: "raw-key-box", role: "alert" },
    h("strong", `Key “${created.name}” created. This is the only time its value is shown: copy it now.`),
    h("div.raw-key-value", value, copy),
    h("p.muted", "Engram keeps only a hash of it; if it is lost, delete the key and create another."),
  );
}

function keyEditor(key, refresh, status) {
  const daily = h("input", { name: "daily_limit", type: "number", min: 0, value: key.daily_limit ?? "", placeholder: "unlimited" });
  const workspace = h("input", { name: "workspace", value: key.default_workspace ?? "", placeholder: "none" });
  const mode = select("default_mode", [["", "none"], ...MODES.map((m) => [m, m])], key.default_mode ?? "");
  const act = async (what, call) => {
    // "saved" once the list and this editor show the new values (not before they are redrawn).
    replace(status);
    try { await call(); await refresh(key.id); notice(status, `${what}: saved.`); } catch (error) { notice(status, `${what}: ${error.message}`, "error"); }
  };
  const nextStatus = key.status === "active" ? "inactive" : "active";
  return card(`key ${key.name}`,
    h("dl.kv",
      h("dt", "id"), h("dd", h("code", key.id)),
      h("dt", "prefix"), h("dd", h("code", key.key_prefix ?? "")),
      h("dt", "status"), h("dd", { id: "key-status" }, key.status),
      h("dt", "permissions"), h("dd", (key.permissions ?? []).join(", ")),
      h("dt", "created"), h("dd", fmtTime(key.created_at)),
      h("dt", "last used"), h("dd", fmtTime(key.last_used_at) || "never"),
      h("dt", "calls today"), h("dd", String(key.calls_today ?? 0)),
      h("dt", "fragments"), h("dd", `${key.fragment_count ?? 0}${key.fragment_limit != null ? ` of ${key.fragment_limit}` : ""}`),
    ),
    h("div.actions",
      h("button", { type: "button", id: "toggle-status", onclick: () => act(`Set ${nextStatus}`, () => api("PUT", `/keys/${encodeURIComponent(key.id)}`, { body: { status: nextStatus } })) },
        key.status === "active" ? "Deactivate" : "Activate"),
      confirmButton("Delete key", "Click again to delete", () => act("Delete", async () => {
        await api("DELETE", `/keys/${encodeURIComponent(key.id)}`);
      })),
    ),
    h("form.inline-form", { id: "edit-daily-limit", onsubmit: (e) => { e.preventDefault(); act("Daily limit", () => api("PUT", `/keys/${encodeURIComponent(key.id)}/daily-limit`, { body: { daily_limit: numberOrNull(daily) } })); } },
      field("Daily call limit", daily), h("button", { type: "submit" }, "Save limit")),
    h("form.inline-form", { id: "edit-workspace", onsubmit: (e) => { e.preventDefault(); act("Workspace", () => api("PATCH", `/keys/${encodeURIComponent(key.id)}/workspace`, { body: { workspace: workspace.value.trim() || null } })); } },
      field("Default workspace", workspace), h("button", { type: "submit" }, "Save workspace")),
    h("form.inline-form", { id: "edit-mode", onsubmit: (e) => { e.preventDefault(); act("Default mode", () => api("PUT", `/keys/${encodeURIComponent(key.id)}`, { body: { default_mode: mode.value || null } })); } },
      field("Default mode", mode), h("button", { type: "submit" }, "Save mode")),
  );
}

function groupsCard(getKeys, status) {
  const box = h("div", { id: "groups" });
  const members = h("div", { id: "group-members" });
  const name = h("input", { name: "group_name", required: true, maxlength: 200, placeholder: "group name" });
  const description = h("input", { name: "group_description", maxlength: 1000, placeholder: "description (optional)" });
  const form = h("form.inline-form", { id: "create-group" }, field("Name", name), field("Description", description), h("button", { type: "submit" }, "Create group"));

  async function showMembers(group) {
    const list = await api("GET", `/groups/${encodeURIComponent(group.id)}/members`);
    const memberIds = new Set(list.map((m) => m.id ?? m.key_id));
    const pick = select("key_id", getKeys().filter((k) => !memberIds.has(k.id)).map((k) => [k.id, `${k.name} (${k.key_prefix ?? short(k.id)})`]), "");
    const add = h("form.inline-form", { id: "add-member" }, field("Add key", pick), h("button", { type: "submit" }, "Add"));
    add.addEventListener("submit", async (e) => {
      e.preventDefault();
      if (!pick.value) return;
      try { await api("POST", `/groups/${encodeURIComponent(group.id)}/members`, { body: { key_id: pick.value } }); await showMembers(group); } catch (error) { notice(status, error.message, "error"); }
    });
    replace(members, card(`members of ${group.name}`,
      table(list, [
        { key: "name" }, { key: "key_prefix", label: "prefix" }, { key: "status" },
        { key: "remove", label: "", render: (m) => confirmButton("Remove", "Click again", async () => {
          try { await api("DELETE", `/groups/${encodeURIComponent(group.id)}/members/${encodeURIComponent(m.id ?? m.key_id)}`); await showMembers(group); } catch (error) { notice(status, error.message, "error"); }
        }) },
      ], { empty: "No members yet." }),
      add,
    ));
  }

  async function load() {
    const groups = await api("GET", "/groups");
    replace(box, table(groups, [
      { key: "name" }, { key: "description" },
      { key: "members", render: (g) => g.member_count ?? g.members ?? "" },
      { key: "created_at", label: "created", render: (g) => fmtTime(g.created_at) },
      { key: "delete", label: "", render: (g) => confirmButton("Delete", "Click again", async () => {
        try { await api("DELETE", `/groups/${encodeURIComponent(g.id)}`); replace(members); await load(); } catch (error) { notice(status, error.message, "error"); }
      }) },
    ], { onRow: (g) => showMembers(g).catch((error) => notice(status, error.message, "error")), empty: "No groups yet." }));
  }
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    try { await api("POST", "/groups", { body: { name: name.value.trim(), description: description.value.trim() || null } }); form.reset(); await load(); } catch (error) { notice(status, error.message, "error"); }
  });
  return { element: card("groups", form, box, members), load };
}

export async function render(root) {
  const status = h("div", { id: "keys-status" });
  const rawBox = h("div");
  const listBox = h("div", { id: "keys-table" });
  const editor = h("div", { id: "key-editor" });
  let keys = [];

  async function refresh(selected) {
    keys = await api("GET", "/keys");
    replace(listBox, table(keys, [
      { key: "name" },
      { key: "key_prefix", label: "prefix" },
      { key: "status" },
      { key: "permissions" },
      { key: "default_workspace", label: "workspace" },
      { key: "default_mode", label: "mode" },
      { key: "daily_limit", label: "daily limit" },
      { key: "calls_today", label: "calls today" },
      { key: "fragment_count", label: "fragments" },
      { key: "last_used_at", label: "last used", render: (k) => fmtTime(k.last_used_at) },
    ], { onRow: (k) => refresh(k.id), rowClass: (k) => (k.status === "active" ? null : "inactive"), empty: "No API keys yet." }));
    const key = keys.find((k) => k.id === selected);
    replace(editor, key ? keyEditor(key, refresh, status) : null);
    await groups.load();
  }
  const groups = groupsCard(() => keys, status);
  const created = (key) => { replace(rawBox, rawKeyNotice(key)); refresh(key.id).catch((e) => notice(status, e.message, "error")); };
  root.append(status, card("new key", createForm(created, status), rawBox), card("keys", listBox), editor, groups.element);
  await refresh(null);
}
