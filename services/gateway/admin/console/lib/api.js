// The admin REST client. The master key lives in sessionStorage only: it goes with the tab
// (never localStorage, never a cookie), and every call sends it as a Bearer header.

export const BASE = "/v1/internal/model/nothing";
const KEY_SLOT = "engram.console.masterKey";

export const masterKey = {
  get() { return sessionStorage.getItem(KEY_SLOT); },
  set(value) { sessionStorage.setItem(KEY_SLOT, value); },
  clear() { sessionStorage.removeItem(KEY_SLOT); },
};

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

function messageOf(status, body, text) {
  const detail = body && typeof body === "object" ? (body.detail ?? body.error ?? body.message) : null;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) return detail.map((d) => d.msg ?? JSON.stringify(d)).join("; ");
  if (status === 404) return "not found (this route may not exist on this server yet)";
  return text ? text.slice(0, 300) : `HTTP ${status}`;
}

let onUnauthorized = () => {};
export function whenUnauthorized(handler) { onUnauthorized = handler; }

/** api("GET", "/stats", {query: {...}}) -> parsed JSON; raises ApiError on a non-2xx. */
export async function api(method, path, { query, body, raw = false } = {}) {
  const url = new URL(BASE + path, window.location.origin);
  for (const [name, value] of Object.entries(query ?? {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, String(value));
  }
  const headers = { Authorization: `Bearer ${masterKey.get() ?? ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(url, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store", credentials: "omit", redirect: "error",
  });
  if (raw && response.ok) return response;
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (response.status === 401) {
    masterKey.clear();
    onUnauthorized();
    throw new ApiError(401, "the master key was refused; log in again", data);
  }
  if (!response.ok) throw new ApiError(response.status, messageOf(response.status, data, text), data);
  return data ?? text;
}

/** POST /auth: true when the server takes `key` as the master key. */
export async function checkMasterKey(key) {
  const response = await fetch(new URL(`${BASE}/auth`, window.location.origin), {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ key }),
    cache: "no-store", credentials: "omit",
  });
  if (response.status === 401) return false;
  if (!response.ok) throw new ApiError(response.status, `the server answered HTTP ${response.status}`);
  return true;
}
