// The MessageX management UI: log in, then hash-routed pages. No framework, no HTML parsing
// of data: every view builds its DOM with dom.js, whose helpers only ever create Text nodes.

import { api, session, setUnauthorizedHandler } from "./api.js";
import { h, fill, route, field } from "./dom.js";
import { Client } from "./messagex.js";
import * as views from "./views.js";
import { consumeView, resetConsumer } from "./consume.js";
import { connectionsView, healthView } from "./diagnosis.js";

const REFRESH_MS = 2000;

const els = {
  nav: document.getElementById("nav"),
  main: document.getElementById("main"),
  status: document.getElementById("status"),
  who: document.getElementById("who"),
  conn: document.getElementById("conn"),
};

let current = null; // the mounted view: {refresh?, dispose?}
let refreshTimer = null;
let mx = null; // the WebSocket client of this session
let statusTimer = null;

/** Tell the user something: polite for info, assertive (role=alert) for errors. */
export function notify(message, kind = "info") {
  clearTimeout(statusTimer);
  els.status.setAttribute("role", kind === "error" ? "alert" : "status");
  fill(els.status, h("p", { class: `notice ${kind}` }, message));
  if (kind !== "error") statusTimer = setTimeout(() => fill(els.status), 6000);
}

export function clearNotice() {
  fill(els.status);
}

/** Show an ApiError (or any error) as text. */
export function showError(error, what) {
  const detail = error && (error.detail || error.message) ? error.detail || error.message : String(error);
  const code = error && error.code ? ` (${error.code})` : "";
  notify(what ? `${what}: ${detail}${code}` : `${detail}${code}`, "error");
}

/** The WebSocket client, created on first use after login. */
export function messagex() {
  if (!mx) {
    mx = new Client({ token: session.token });
    mx.addEventListener("state", (e) => renderConnection(e.detail));
    mx.addEventListener("error", (e) => showError(e.detail.error, "WebSocket"));
    mx.connect().catch((e) => showError(e, "WebSocket"));
  }
  return mx;
}

function renderConnection(detail) {
  const labels = {
    idle: "",
    connecting: "WebSocket: connecting…",
    open: "WebSocket: connected",
    reconnecting: "WebSocket: reconnecting…",
    closed: "WebSocket: closed",
  };
  fill(els.conn, labels[detail.state] || "");
  els.conn.dataset.state = detail.state;
}

export const ctx = { notify, showError, clearNotice, messagex, get user() { return session.user; } };

// -- session ---------------------------------------------------------------------------

function loginView(main, params) {
  const username = h("input", { name: "username", autocomplete: "username", required: true });
  const password = h("input", {
    name: "password", type: "password", autocomplete: "current-password", required: true,
  });
  const submit = h("button", { type: "submit" }, "Log in");
  const form = h(
    "form",
    { class: "card narrow", "aria-labelledby": "login-title" },
    field("Username", username),
    field("Password", password),
    submit,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    submit.disabled = true;
    try {
      const login = await api("POST", "/auth/login", {
        body: { username: username.value, password: password.value },
        auth: false,
      });
      session.save(login.token, { username: username.value, role: "user" });
      const me = await api("GET", "/auth/me");
      session.save(login.token, { username: me.username, role: me.role });
      password.value = "";
      clearNotice();
      startSession();
      location.hash = params.next && params.next !== "#/login" ? params.next : route("overview");
    } catch (error) {
      session.clear();
      const message = error.status === 429 ? "Too many failed logins; try again later" : null;
      showError(message ? { detail: message, code: error.code } : error, "Login failed");
      password.select();
    } finally {
      submit.disabled = false;
    }
  });
  fill(main, h("h1", { id: "login-title", tabindex: "-1" }, "Log in to MessageX"), form);
  username.focus();
}

function startSession() {
  renderNav();
  messagex();
}

function endSession(message) {
  session.clear();
  if (mx) {
    mx.close();
    mx = null;
  }
  resetConsumer();
  fill(els.conn);
  renderNav();
  if (message) notify(message, "error");
  location.hash = route("login");
}

async function logout() {
  try {
    await api("POST", "/auth/logout");
  } catch {
    // the token is forgotten here whatever the broker says
  }
  endSession();
  notify("Logged out");
}

setUnauthorizedHandler(() => {
  if (session.token) endSession("Your session has ended; log in again");
});

// -- navigation ------------------------------------------------------------------------

const PAGES = [
  ["overview", "Overview"],
  ["exchanges", "Exchanges"],
  ["queues", "Queues"],
  ["publish", "Publish"],
  ["consume", "Consume"],
  ["users", "Users", "admin"],
  ["connections", "Connections", "admin"],
  ["health", "Health", "admin"],
];

function renderNav() {
  const user = session.user;
  if (!session.token || !user) {
    fill(els.nav);
    fill(els.who);
    return;
  }
  const links = PAGES.filter(([, , role]) => !role || user.role === role).map(([page, label]) =>
    h("li", null, h("a", { href: route(page), dataset: { page } }, label)),
  );
  // The API documents: REST (Swagger UI over /openapi.json) and WebSocket (AsyncAPI 3.0).
  const docs = [
    ["/docs", "REST API"],
    ["/asyncapi.json", "WebSocket API"],
  ].map(([href, label]) => h("li", { class: "doc-link" }, h("a", { href, target: "_blank" }, label)));
  fill(els.nav, h("ul", null, [...links, ...docs]));
  fill(
    els.who,
    h("span", null, `${user.username} (${user.role})`),
    " ",
    h("button", { type: "button", class: "link", onClick: logout }, "Log out"),
  );
  markCurrent();
}

function markCurrent() {
  const page = parseHash().parts[0] || "overview";
  for (const a of els.nav.querySelectorAll("a")) {
    if (a.dataset.page === page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = raw.split("?", 2);
  let parts;
  try {
    parts = path.split("/").filter((p) => p !== "").map(decodeURIComponent);
  } catch {
    parts = ["not-found"];
  }
  return { parts, query: new URLSearchParams(query) };
}

const ROUTES = {
  overview: (main, p) => views.overviewView(main, p, ctx),
  exchanges: (main, p) =>
    p.parts[1] !== undefined ? views.exchangeView(main, p, ctx) : views.exchangesView(main, p, ctx),
  queues: (main, p) =>
    p.parts[1] !== undefined ? views.queueView(main, p, ctx) : views.queuesView(main, p, ctx),
  publish: (main, p) => views.publishView(main, p, ctx),
  consume: (main, p) => consumeView(main, p, ctx),
  users: (main, p) => views.usersView(main, p, ctx),
  connections: (main, p) => connectionsView(main, p, ctx),
  health: (main, p) => healthView(main, p, ctx),
};

function dispose() {
  clearInterval(refreshTimer);
  refreshTimer = null;
  if (current && current.dispose) current.dispose();
  current = null;
}

function navigate() {
  dispose();
  const params = parseHash();
  if (!session.token) {
    if (params.parts[0] !== "login") {
      location.replace(route("login"));
      return;
    }
    loginView(els.main, { next: null });
    return;
  }
  if (params.parts.length === 0 || params.parts[0] === "login") {
    location.replace(route("overview"));
    return;
  }
  markCurrent();
  const render = ROUTES[params.parts[0]];
  if (!render) {
    fill(els.main, h("h1", { tabindex: "-1" }, "Page not found"), h("p", null, h("a", { href: route("overview") }, "Back to the overview")));
  } else {
    current = render(els.main, params) || null;
    if (current && current.refresh) {
      refreshTimer = setInterval(() => {
        if (document.visibilityState === "visible") current.refresh();
      }, REFRESH_MS);
    }
  }
  const heading = els.main.querySelector("h1");
  if (heading && !els.main.contains(document.activeElement)) heading.focus({ preventScroll: true });
}

window.addEventListener("hashchange", navigate);

// The skip link must not change the hash (the hash is the route): focus <main> instead.
document.getElementById("skip").addEventListener("click", (event) => {
  event.preventDefault();
  els.main.focus();
});

async function boot() {
  if (session.token) {
    try {
      const me = await api("GET", "/auth/me");
      session.save(session.token, { username: me.username, role: me.role });
      startSession();
    } catch {
      session.clear();
    }
  }
  renderNav();
  navigate();
}

boot();
