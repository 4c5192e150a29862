// The REST API (/api/v1) with the session's Bearer token. Errors are RFC 9457 problem
// details; they reject as ApiError carrying the broker's `code` and `detail`.

const TOKEN_KEY = "messagex.token";
const USER_KEY = "messagex.user";

export class ApiError extends Error {
  constructor(status, code, detail, errors) {
    super(detail || code || `HTTP ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.code = code || "error";
    this.detail = detail || "";
    this.errors = errors || [];
  }
}

/** The session lives in sessionStorage: gone with the tab, never sent as a cookie. */
export const session = {
  get token() {
    return sessionStorage.getItem(TOKEN_KEY);
  },
  get user() {
    try {
      return JSON.parse(sessionStorage.getItem(USER_KEY) || "null");
    } catch {
      return null;
    }
  },
  save(token, user) {
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.setItem(USER_KEY, JSON.stringify(user));
  },
  clear() {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(USER_KEY);
  },
};

let onUnauthorized = () => {};

/** Called when the broker answers 401 to a call made with the session's token. */
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

async function problemOf(response) {
  try {
    const body = await response.json();
    const first = Array.isArray(body.errors) && body.errors.length ? body.errors[0] : null;
    let detail = body.detail || body.title;
    if (first && first.msg) {
      const where = Array.isArray(first.loc) ? first.loc.filter((p) => p !== "body").join(".") : "";
      detail = where ? `${where}: ${first.msg}` : first.msg;
    }
    return new ApiError(response.status, body.code, detail, body.errors);
  } catch {
    return new ApiError(response.status, "error", `HTTP ${response.status}`);
  }
}

/**
 * Call /api/v1`path`. `query` values that are null/undefined/"" are left out. Resolves with
 * the parsed JSON (null for 204) — or {status, data} with `withStatus` — and rejects with
 * ApiError.
 */
export async function api(method, path, { body, query, auth = true, withStatus = false } = {}) {
  const url = new URL(`/api/v1${path}`, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = { Accept: "application/json" };
  if (auth && session.token) headers.Authorization = `Bearer ${session.token}`;
  const init = { method, headers, credentials: "omit", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch {
    throw new ApiError(0, "network_error", "the broker cannot be reached");
  }
  if (!response.ok) {
    const error = await problemOf(response);
    if (response.status === 401 && auth) onUnauthorized(error);
    throw error;
  }
  const data = response.status === 204 ? null : await response.json();
  return withStatus ? { status: response.status, data } : data;
}

/** A name in a URL path: names are restricted, but encode anyway. */
export function seg(name) {
  return encodeURIComponent(name);
}

/** Prometheus text → {metricName: summed value} for the names asked for. */
export async function metrics(names) {
  const response = await fetch("/metrics", { credentials: "omit", cache: "no-store" });
  if (!response.ok) throw new ApiError(response.status, "error", "metrics unavailable");
  const text = await response.text();
  const totals = Object.fromEntries(names.map((n) => [n, 0]));
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (match && match[1] in totals) totals[match[1]] += Number(match[3]);
  }
  return totals;
}
