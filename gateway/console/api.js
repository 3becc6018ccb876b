// The HTTP API with the signed-in token (kept in sessionStorage: it goes when the tab closes).

const KEY = "openbot.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

export const session = {
  get token() {
    return sessionStorage.getItem(KEY);
  },
  set token(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  },
};

export async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${session.token}` };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const type = resp.headers.get("content-type") || "";
  const data = type.includes("json") ? await resp.json().catch(() => null) : await resp.text();
  if (!resp.ok) {
    const err = (data && data.error) || {};
    throw new ApiError(resp.status, err.code, err.message || `HTTP ${resp.status}`);
  }
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body ?? {});

// Every page of a listing route ({items, nextCursor}), up to `max` records.
export async function listAll(path, max = 1000) {
  const out = [];
  let cursor = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const url = `${path}${sep}limit=200` + (cursor ? `&cursor=${encodeURIComponent(cursor)}` : "");
    const page = await get(url);
    out.push(...(page.items || []));
    cursor = page.nextCursor ?? page.next_cursor ?? null;
  } while (cursor && out.length < max);
  return out;
}

export function q(params) {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") s.set(k, v);
  const text = s.toString();
  return text ? `?${text}` : "";
}
