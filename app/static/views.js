// The pages of the UI. Each view renders into `main` and may return {refresh, dispose}:
// app.js calls refresh() every couple of seconds while the page is shown (live stats).
// Every value from the broker is rendered as text (dom.js); names go into hash links only
// through route(), which percent-encodes them.

import { api, seg, metrics } from "./api.js";
import { filterOperations } from "./message_ops.js";
import { historyCharts } from "./charts.js";
import {
  h, fill, append, route, link, json, field, checkbox, dl, table, formatTime, parseJsonField,
  nextId, filterBox,
} from "./dom.js";
import { diagnosisPanel } from "./diagnosis.js";

const STATUSES = ["ready", "delayed", "in_flight", "dead"];
const STATUS_LABELS = { ready: "Ready", delayed: "Delayed", in_flight: "In flight", dead: "Dead" };
const BODY_DISPLAY_LIMIT = 4096;
const PAGE_SIZES = [10, 25, 100];

// -- small building blocks -------------------------------------------------------------

function heading(text) {
  return h("h1", { tabindex: "-1" }, text);
}

function section(title, ...children) {
  const id = nextId("s");
  return h("section", { "aria-labelledby": id }, h("h2", { id }, title), children);
}

function button(label, onClick, props = {}) {
  return h("button", { type: "button", onClick, ...props }, label);
}

/** Wrap an async form handler: preventDefault, disable the submit button meanwhile. */
function onSubmit(form, handler) {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const submit = form.querySelector("button[type=submit]");
    if (submit) submit.disabled = true;
    try {
      await handler();
    } finally {
      if (submit) submit.disabled = false;
    }
  });
  return form;
}

/** A JSON textarea with its own inline error. */
function jsonInput(label, initial, hint) {
  const input = h("textarea", { rows: 3, spellcheck: "false", class: "code" }, initial);
  const error = h("p", { class: "field-error", id: nextId("err"), hidden: true });
  input.setAttribute("aria-describedby", error.id);
  const wrapper = field(label, input, hint);
  wrapper.append(error);
  return {
    el: wrapper,
    input,
    /** The parsed value, or undefined (and the error shown) when it is not valid JSON. */
    read(fallback, { object = false } = {}) {
      const result = parseJsonField(input.value, fallback);
      let message = result.ok ? null : `Not valid JSON: ${result.error}`;
      if (result.ok && object && (typeof result.value !== "object" || result.value === null || Array.isArray(result.value))) {
        message = "Must be a JSON object, like {\"key\": \"value\"}";
      }
      error.hidden = !message;
      error.textContent = message || "";
      input.setAttribute("aria-invalid", message ? "true" : "false");
      if (message) {
        input.focus();
        return undefined;
      }
      return result.value;
    },
  };
}

function optionalInt(input) {
  const v = input.value.trim();
  return v === "" ? null : Number(v);
}

/**
 * Declare-form fields for the length limits and the priority of contract §13, labelled with
 * their RabbitMQ names; `read(args)` adds the filled ones to an arguments object.
 */
function limitFields() {
  const maxLength = h("input", { name: "x-max-length", type: "number", min: 0, inputmode: "numeric" });
  const maxBytes = h("input", { name: "x-max-length-bytes", type: "number", min: 0, inputmode: "numeric" });
  const overflow = h("select", { name: "x-overflow" },
    ["", "drop-head", "reject-publish", "reject-publish-dlx"].map((v) => h("option", { value: v }, v || "(default: drop-head)")));
  const maxPriority = h("input", { name: "x-max-priority", type: "number", min: 1, max: 255, inputmode: "numeric" });
  const els = [
    field("Max length (x-max-length)", maxLength, "Ready copies; empty: unlimited"),
    field("Max length bytes (x-max-length-bytes)", maxBytes, "Body bytes of ready copies; empty: unlimited"),
    field("Overflow (x-overflow)", overflow, "What a publish into a full queue does"),
    field("Max priority (x-max-priority)", maxPriority, "1–255: claim by message priority; empty: none"),
  ];
  function read(args) {
    const out = { ...args };
    for (const [key, input] of [["x-max-length", maxLength], ["x-max-length-bytes", maxBytes], ["x-max-priority", maxPriority]]) {
      const v = optionalInt(input);
      if (v !== null) out[key] = v;
    }
    if (overflow.value) out["x-overflow"] = overflow.value;
    return out;
  }
  return { els, read };
}

/** The §13 limits and priority of a queue's arguments, as settings rows. */
function limitRows(args) {
  return [
    ["Max length (x-max-length)", args["x-max-length"] ?? "unlimited"],
    ["Max length bytes (x-max-length-bytes)", args["x-max-length-bytes"] ?? "unlimited"],
    ["Overflow (x-overflow)", args["x-overflow"] ?? "drop-head"],
    ["Max priority (x-max-priority)", args["x-max-priority"] ?? "none"],
  ];
}

function yesNo(value) {
  return value ? "yes" : "no";
}

/** Contract §13's lifecycle arguments as form fields, with their RabbitMQ names shown; what
 * is filled in is merged into the arguments object (a field wins over the same key there). */
function lifecycleArgumentFields() {
  const spec = [
    ["x-message-ttl", "Message TTL (ms)", "Empty: none. A copy expires this long after it becomes available", "number"],
    ["x-expires", "Queue expiry (ms)", "Empty: never. Deleted once unused this long (at least 1000)", "number"],
    ["x-dead-letter-exchange", "Dead-letter exchange", "Empty: none. An existing exchange (not with a dead-letter queue)", "text"],
    ["x-dead-letter-routing-key", "Dead-letter routing key", "Empty: the message's own key", "text"],
  ];
  const inputs = spec.map(([key, , , type]) => h("input", type === "number"
    ? { name: key, type: "number", min: 0, inputmode: "numeric" }
    : { name: key, autocomplete: "off" }));
  const els = spec.map(([key, label, help], i) => field(`${label} — ${key}`, inputs[i], help));
  function merge(args) {
    const merged = { ...args };
    spec.forEach(([key, , , type], i) => {
      const raw = inputs[i].value.trim();
      if (raw === "") return;
      merged[key] = type === "number" ? Number(raw) : raw;
    });
    return merged;
  }
  function clear() {
    for (const input of inputs) input.value = "";
  }
  return { els, merge, clear };
}

/** When a browsed copy expires (contract §13): available_at plus the smaller of the queue's
 * x-message-ttl and the message's expiration; null when neither is set. */
export function expiryOf(message, queueArguments) {
  const ttls = [];
  const queueTtl = queueArguments ? queueArguments["x-message-ttl"] : undefined;
  if (Number.isInteger(queueTtl)) ttls.push(queueTtl);
  const expiration = message.properties ? message.properties.expiration : undefined;
  if (typeof expiration === "string" && /^[0-9]+$/.test(expiration)) ttls.push(Number(expiration));
  if (ttls.length === 0) return null;
  return new Date(Date.parse(message.available_at) + Math.min(...ttls)).toISOString();
}

/** The priority a copy is claimed by (contract §13): in a queue with x-max-priority the
 * message's own, capped at that maximum, and 0 without one; null in other queues (where a
 * priority is stored and ignored). */
export function effectivePriority(message, queueArguments) {
  const max = queueArguments ? queueArguments["x-max-priority"] : undefined;
  if (!Number.isInteger(max)) return null;
  const own = message.properties ? message.properties.priority : undefined;
  return Math.min(Number.isInteger(own) ? own : 0, max);
}

/** A browsed copy's priority row: the one the broker claims it by, and why when that is not
 * the message's own; null when it has none and none is used. */
function priorityRow(m, queueArguments) {
  const own = m.properties ? m.properties.priority : undefined;
  if (queueArguments === undefined) return own === undefined ? null : ["Priority", String(own)];
  const used = effectivePriority(m, queueArguments);
  if (used === null) {
    return own === undefined ? null : ["Priority", `${own} (ignored: the queue has no x-max-priority)`];
  }
  if (own === used) return ["Priority", String(used)];
  return ["Priority", own === undefined
    ? `${used} (none set)`
    : `${used} (set ${own}, capped at x-max-priority ${queueArguments["x-max-priority"]})`];
}

/** A browsed copy's expiry row (contract §13). A ready copy (delayed ones too: their TTL
 * runs from available_at) expires at expiryOf; an in-flight one never expires while it is
 * held, but, returned to the queue after that time (NACK with requeue, ack timeout, release),
 * it expires instead of being requeued (requeueing keeps available_at). Dead copies do not
 * expire. */
function expiryRow(m, queueArguments) {
  const at = expiryOf(m, queueArguments);
  if (at === null || m.status === "dead") return null;
  if (m.status === "in_flight") {
    return ["Expiry", `None while in flight; returned to the queue after ${formatTime(at)}, it expires instead of being requeued`];
  }
  return ["Expires", formatTime(at)];
}

/** The arguments of the queues whose page was opened (their browsed copies show expiry). */
const queueArgumentsSeen = new Map();

/** Body of a stored message or delivery, as display text (truncated when huge). */
export function bodyText(item) {
  if (item.body_base64 !== undefined && item.body_base64 !== null) {
    return `(binary, base64) ${truncate(item.body_base64)}`;
  }
  return truncate(json(item.body));
}

function truncate(text) {
  return text.length > BODY_DISPLAY_LIMIT
    ? `${text.slice(0, BODY_DISPLAY_LIMIT)}… (${text.length - BODY_DISPLAY_LIMIT} more characters)`
    : text;
}

function pre(text, label) {
  return h("pre", { class: "code", tabindex: "0", "aria-label": label }, text);
}

/** Tickets for a loader that may be called again before its last call answered (a page size
 * changed while the first page loads): only the newest call may render. */
function sequencer() {
  let latest = 0;
  return () => {
    const mine = ++latest;
    return () => mine === latest;
  };
}

/** Keyset pagination state: a stack of cursors. */
function pager(onChange) {
  const state = { cursors: [null], index: 0, next: null };
  const prev = button("Previous page", () => {
    if (state.index > 0) {
      state.index -= 1;
      onChange();
    }
  });
  const next = button("Next page", () => {
    if (state.next !== null) {
      state.cursors[state.index + 1] = state.next;
      state.index += 1;
      onChange();
    }
  });
  const label = h("span", { class: "page-label" });
  return {
    el: h("div", { class: "pager" }, prev, label, next),
    get after() {
      return state.cursors[state.index];
    },
    reset() {
      state.cursors = [null];
      state.index = 0;
    },
    update(nextAfter) {
      state.next = nextAfter ?? null;
      prev.disabled = state.index === 0;
      next.disabled = state.next === null;
      label.textContent = `Page ${state.index + 1}`;
    },
  };
}

/** Names for a <datalist> (first 1000, enough for a hint). */
async function namesOf(path) {
  try {
    const page = await api("GET", path, { query: { limit: 1000 } });
    return page.items.map((i) => i.name);
  } catch {
    return [];
  }
}

function datalist(names) {
  const id = nextId("dl");
  return { id, el: h("datalist", { id }, names.map((n) => h("option", { value: n }))) };
}

async function confirmThen(question, action) {
  if (window.confirm(question)) await action();
}

// -- overview --------------------------------------------------------------------------

const RATE_METRICS = {
  publish: "messagex_messages_published_total",
  deliver: "messagex_messages_delivered_total",
  ack: "messagex_messages_acked_total",
};
let lastSample = null; // {t, totals} from the previous /metrics read, kept across visits

function statList(pairs, prefix) {
  return h(
    "dl",
    { class: "stats" },
    pairs.map(([key, label, value]) => h("div", { class: "stat" }, h("dt", null, label), h("dd", { dataset: { stat: `${prefix}${key}` } }, String(value)))),
  );
}

export function overviewView(main, _params, ctx) {
  const broker = h("div");
  const messages = h("div");
  const rates = h("div");
  const scope = h("p", { class: "hint" });
  // the charts' history is broker-wide, for admins only (GET /overview/history)
  const charts = ctx.user && ctx.user.role === "admin" ? historyCharts("/overview/history", ctx) : null;
  fill(
    main,
    heading("Overview"),
    scope,
    section("Broker", broker),
    section("Messages by status", messages),
    charts && section("Last 10 minutes", charts.el),
    section("Rates", rates),
  );

  async function loadCounts() {
    if (ctx.user && ctx.user.role === "admin") {
      const o = await api("GET", "/overview");
      scope.textContent = `Broker-wide counts, version ${o.version}.`;
      fill(broker, statList([
        ["queues", "Queues", o.queues],
        ["exchanges", "Exchanges", o.exchanges],
        ["connections", "Connections", o.connections],
        ["subscriptions", "Subscriptions", o.subscriptions],
      ], "overview-"));
      return o.messages;
    }
    // Not an admin: /overview is admin only; sum the queues this user can see.
    const page = await api("GET", "/queues", { query: { limit: 1000 } });
    scope.textContent = "Counts of the queues you have permissions on (the broker-wide overview is for admins).";
    const sums = { ready: 0, delayed: 0, in_flight: 0, dead: 0, consumers: 0 };
    for (const q of page.items) for (const k of Object.keys(sums)) sums[k] += q.stats[k];
    fill(broker, statList([
      ["queues", "Queues", page.items.length],
      ["consumers", "Consumers", sums.consumers],
    ], "overview-"));
    return sums;
  }

  async function loadRates() {
    const totals = await metrics(Object.values(RATE_METRICS));
    const now = performance.now();
    const rows = [];
    for (const [key, metric] of Object.entries(RATE_METRICS)) {
      let rate = "—";
      if (lastSample && now > lastSample.t) {
        const delta = totals[metric] - lastSample.totals[metric];
        if (delta >= 0) rate = `${(delta / ((now - lastSample.t) / 1000)).toFixed(1)}/s`;
      }
      rows.push([key, { publish: "Publish", deliver: "Deliver", ack: "Ack" }[key], rate]);
    }
    const window = lastSample ? ((now - lastSample.t) / 1000).toFixed(1) : null;
    lastSample = { t: now, totals };
    fill(
      rates,
      statList(rows, "rate-"),
      h("p", { class: "hint" }, window
        ? `Messages per second handled by the broker process serving this page, from /metrics, over the last ${window} s.`
        : "Messages per second of the broker process serving this page, from /metrics (needs two samples)."),
    );
  }

  async function refresh() {
    try {
      const counts = await loadCounts();
      const total = STATUSES.reduce((n, s) => n + counts[s], 0);
      fill(messages, statList([...STATUSES.map((s) => [s, STATUS_LABELS[s], counts[s]]), ["total", "Total", total]], "messages-"));
      await loadRates();
    } catch (error) {
      ctx.showError(error, "Overview");
    }
    if (charts) await charts.refresh();
  }
  refresh();
  return { refresh };
}

// -- exchanges -------------------------------------------------------------------------

const EXCHANGE_TYPES = ["direct", "fanout", "topic", "headers"];

export function exchangesView(main, _params, ctx) {
  const list = h("div");
  const pages = pager(() => refresh());

  const name = h("input", { name: "name", required: true, autocomplete: "off" });
  const type = h("select", { name: "type" }, EXCHANGE_TYPES.map((t) => h("option", { value: t }, t)));
  const durable = checkbox("Durable", { checked: true });
  const autoDelete = checkbox("Auto-delete (when its last binding goes)");
  const alternate = h("input", { name: "alternate-exchange", autocomplete: "off" });
  const alternates = datalist([]);
  alternate.setAttribute("list", alternates.id);
  namesOf("/exchanges").then((list) => append(alternates.el, list.map((n) => h("option", { value: n }))));
  const args = jsonInput("Other arguments (JSON object)", "{}");
  const form = h(
    "form",
    { class: "card" },
    field("Name", name, "1–255 of A–Z a–z 0–9 _ . : - , starting with a letter or digit"),
    field("Type", type),
    durable.el,
    autoDelete.el,
    field(
      "Alternate exchange (alternate-exchange)",
      alternate,
      "Optional: an existing exchange that gets the messages this one routes to no queue",
    ),
    alternates.el,
    args.el,
    h("button", { type: "submit" }, "Declare exchange"),
  );
  onSubmit(form, async () => {
    let argumentsValue = args.read({}, { object: true });
    if (argumentsValue === undefined) return;
    if (alternate.value !== "") argumentsValue = { ...argumentsValue, "alternate-exchange": alternate.value };
    try {
      const r = await api("PUT", `/exchanges/${seg(name.value)}`, {
        body: { type: type.value, durable: durable.input.checked, auto_delete: autoDelete.input.checked, arguments: argumentsValue },
        withStatus: true,
      });
      ctx.notify(r.status === 201 ? `Exchange ${r.data.name} declared` : `Exchange ${r.data.name} already exists as declared`);
      name.value = "";
      alternate.value = "";
      refresh();
    } catch (error) {
      ctx.showError(error, "Declare exchange");
    }
  });

  const filter = filterBox("Filter exchanges by name", () => {
    pages.reset();
    refresh();
  });
  fill(main, heading("Exchanges"), section("All exchanges", filter.el, list, pages.el), section("Declare an exchange", form));

  const ticket = sequencer();
  async function refresh() {
    const current = ticket();
    try {
      const page = await api("GET", "/exchanges", { query: { limit: 50, after: pages.after, contains: filter.value } });
      if (!current()) return;
      pages.update(page.next_after);
      fill(list, page.items.length === 0
        ? h("p", null, filter.value ? "No exchange names contain this text." : "No exchanges on this page.")
        : table("Exchanges", ["Name", "Type", "Durable", "Auto-delete", "Built-in"], page.items.map((x) => [
          link(x.name, "exchanges", x.name), x.type, yesNo(x.durable), yesNo(x.auto_delete), yesNo(x.builtin),
        ])));
    } catch (error) {
      ctx.showError(error, "Exchanges");
    }
  }
  refresh();
  return { refresh };
}

export function exchangeView(main, params, ctx) {
  const name = params.parts[1];
  const settings = h("div");
  const bindings = h("div");
  const incoming = h("div");
  const actions = h("div", { class: "actions" });
  fill(
    main,
    heading(`Exchange ${name}`),
    h("p", null, link("All exchanges", "exchanges")),
    section("Settings", settings),
    section("Actions", actions),
    section("Bindings from this exchange", bindings, bindingForm(ctx, { exchange: name }, () => loadBindings())),
    section("Exchange bindings to this exchange", incoming),
  );

  async function load() {
    try {
      const x = await api("GET", `/exchanges/${seg(name)}`);
      fill(settings, dl([
        ["Type", x.type],
        ["Durable", yesNo(x.durable)],
        ["Auto-delete", yesNo(x.auto_delete)],
        ["Built-in", yesNo(x.builtin)],
        ["Alternate exchange", typeof x.arguments["alternate-exchange"] === "string"
          ? link(x.arguments["alternate-exchange"], "exchanges", x.arguments["alternate-exchange"])
          : h("em", null, "none")],
        ["Arguments", pre(json(x.arguments), "Arguments")],
      ]));
      const ifUnused = checkbox("Only if no binding leads from or to it");
      fill(
        actions,
        h("a", { href: `${route("publish")}?exchange=${encodeURIComponent(name)}`, class: "button" }, "Publish to this exchange"),
        x.builtin ? h("p", { class: "hint" }, "Built-in exchanges cannot be deleted.") : [
          ifUnused.el,
          button("Delete exchange", () => confirmThen(`Delete the exchange ${name} and its bindings?`, async () => {
            try {
              await api("DELETE", `/exchanges/${seg(name)}`, { query: { if_unused: ifUnused.input.checked || null } });
              ctx.notify(`Exchange ${name} deleted`);
              location.hash = route("exchanges");
            } catch (error) {
              ctx.showError(error, "Delete exchange");
            }
          }), { class: "danger" }),
        ],
      );
      await loadBindings();
    } catch (error) {
      ctx.showError(error, `Exchange ${name}`);
    }
  }

  async function loadBindings() {
    await Promise.all([
      renderBindings(bindings, ctx, { exchange: name }, loadBindings),
      renderBindings(incoming, ctx, { destination_exchange: name }, loadBindings),
    ]);
  }

  load();
  return {};
}

// -- bindings (shared by the exchange and queue pages) ---------------------------------

/** Where a binding leads: its queue, or (exchange-to-exchange) its destination exchange. */
function destinationOf(b) {
  return b.queue !== null
    ? h("span", null, "queue ", link(b.queue, "queues", b.queue))
    : h("span", null, "exchange ", link(b.destination_exchange, "exchanges", b.destination_exchange));
}

async function renderBindings(container, ctx, filter, reload) {
  try {
    const page = await api("GET", "/bindings", { query: { ...filter, limit: 1000 } });
    const rows = page.items.map((b) => [
      filter.exchange !== undefined ? destinationOf(b) : link(b.exchange, "exchanges", b.exchange),
      b.routing_key === "" ? h("em", null, "(empty)") : b.routing_key,
      pre(json(b.arguments), "Arguments"),
      button("Delete", async () => {
        try {
          await api("DELETE", `/bindings/${encodeURIComponent(b.id)}`);
          ctx.notify("Binding deleted");
          await reload();
        } catch (error) {
          ctx.showError(error, "Delete binding");
        }
      }, { "aria-label": `Delete binding ${b.exchange} → ${b.queue ?? b.destination_exchange} (${b.routing_key})` }),
    ]);
    const incoming = filter.destination_exchange !== undefined;
    fill(container, rows.length === 0
      ? h("p", null, incoming ? "No exchange is bound to this one." : "No bindings.")
      : [
        table(incoming ? "Bindings to this exchange" : "Bindings", [filter.exchange !== undefined ? "Destination" : "From exchange", "Routing key", "Arguments", "Actions"], rows),
        page.next_after !== null ? h("p", { class: "hint" }, "Showing the first 1000 bindings.") : null,
      ]);
  } catch (error) {
    ctx.showError(error, "Bindings");
  }
}

/** The "add a binding" form; `fixed` holds the exchange or the queue of the page. From an
 * exchange's page the destination is a queue or (exchange-to-exchange) another exchange. */
function bindingForm(ctx, fixed, reload) {
  const fromExchange = fixed.exchange !== undefined;
  const otherKind = fromExchange ? "queue" : "exchange";
  const other = h("input", { name: otherKind, required: true, autocomplete: "off" });
  const key = h("input", { name: "routing_key", autocomplete: "off" });
  const args = jsonInput("Arguments (JSON object; headers exchanges match on these)", "{}");
  const names = datalist([]);
  other.setAttribute("list", names.id);
  const kind = h(
    "select",
    { name: "destination_kind" },
    h("option", { value: "queue" }, "a queue"),
    h("option", { value: "exchange" }, "an exchange (its bindings route on)"),
  );
  const otherLabel = h("span", null, fromExchange ? "Queue" : "Exchange");
  async function loadNames() {
    const list = await namesOf(fromExchange && kind.value === "queue" ? "/queues" : "/exchanges");
    fill(names.el, list.map((n) => h("option", { value: n })));
  }
  kind.addEventListener("change", () => {
    otherLabel.textContent = kind.value === "queue" ? "Queue" : "Destination exchange";
    other.name = kind.value === "queue" ? "queue" : "destination_exchange";
    loadNames();
  });
  loadNames();
  const form = h(
    "form",
    { class: "card" },
    h("h3", null, "Add a binding"),
    fromExchange ? field("Bind to", kind) : null,
    field(otherLabel, other),
    names.el,
    field("Routing key", key, "Topic exchanges: * matches one word, # zero or more"),
    args.el,
    h("button", { type: "submit" }, "Bind"),
  );
  return onSubmit(form, async () => {
    const argumentsValue = args.read({}, { object: true });
    if (argumentsValue === undefined) return;
    const toExchange = fromExchange && kind.value === "exchange";
    const body = {
      exchange: fixed.exchange ?? other.value,
      ...(toExchange ? { destination_exchange: other.value } : { queue: fixed.queue ?? other.value }),
      routing_key: key.value,
      arguments: argumentsValue,
    };
    try {
      const r = await api("POST", "/bindings", { body, withStatus: true });
      const target = toExchange ? `exchange ${body.destination_exchange}` : body.queue;
      ctx.notify(r.status === 201 ? `Bound ${target} to ${body.exchange}` : "That binding already exists");
      other.value = "";
      key.value = "";
      await reload();
    } catch (error) {
      ctx.showError(error, "Bind");
    }
  });
}

// -- queues ----------------------------------------------------------------------------

const SINGLE_ACTIVE = "x-single-active-consumer";
const MESSAGE_GROUPS = "x-message-groups";
const DEDUP_WINDOW = "x-deduplication-window-seconds";

/** Contract §15's deduplication window as a declare-form field; `read(args)` adds it when
 * filled in (a field wins over the same key in the JSON arguments). */
function dedupField() {
  const input = h("input", { name: DEDUP_WINDOW, type: "number", min: 1, max: 86400, inputmode: "numeric" });
  const el = field(`Deduplication window (s) — ${DEDUP_WINDOW}`, input,
    "Empty: none. 1–86400: a publish whose message_id this queue received within the window stores nothing here");
  function read(args) {
    const v = optionalInt(input);
    return v === null ? args : { ...args, [DEDUP_WINDOW]: v };
  }
  function clear() {
    input.value = "";
  }
  return { el, read, clear };
}

/** A queue's deduplication window as a settings row. */
function dedupRow(args) {
  const v = args[DEDUP_WINDOW];
  return [`Deduplication window (${DEDUP_WINDOW})`, v === undefined ? "none" : `${v} s`];
}

/** What a publish result says beyond its routed queues: the queues that refused the copy. */
function refusedText(r) {
  const rejected = r.rejected.length ? `; rejected by ${r.rejected.join(", ")} (full)` : "";
  const duplicates = (r.duplicates || []).length
    ? `; duplicate in ${r.duplicates.join(", ")} (message id seen within the window)` : "";
  return rejected + duplicates;
}

/** On a single-active-consumer queue: of its consumers the oldest is the active one (or
 * becomes it once its predecessor's deliveries are settled) and the others wait. */
function singleActiveStats(q) {
  if (q.arguments[SINGLE_ACTIVE] !== true) return [];
  const n = q.stats.consumers;
  return [
    ["consumers-active", "Active consumer", Math.min(n, 1)],
    ["consumers-waiting", "Waiting consumers", Math.max(n - 1, 0)],
  ];
}

export function queuesView(main, _params, ctx) {
  const list = h("div");
  const pages = pager(() => refresh());

  const name = h("input", { name: "name", required: true, autocomplete: "off" });
  const durable = checkbox("Durable", { checked: true });
  const maxDeliveries = h("input", { name: "max_delivery_count", type: "number", min: 1, inputmode: "numeric" });
  const dlq = h("input", { name: "dead_letter_queue", autocomplete: "off" });
  const ackTimeout = h("input", { name: "ack_timeout_seconds", type: "number", min: 1, inputmode: "numeric" });
  const args = jsonInput("Arguments (JSON object)", "{}");
  const limits = limitFields();
  const lifecycle = lifecycleArgumentFields();
  const singleActive = checkbox(`Single active consumer (${SINGLE_ACTIVE})`);
  const messageGroups = checkbox(`Ordered message groups (${MESSAGE_GROUPS})`);
  const dedup = dedupField();
  const form = h(
    "form",
    { class: "card" },
    field("Name", name, "1–255 of A–Z a–z 0–9 _ . : - , starting with a letter or digit"),
    durable.el,
    field("Maximum deliveries", maxDeliveries, "Empty: unlimited"),
    field("Dead-letter queue", dlq, "Empty: none; otherwise an existing queue"),
    field("Ack timeout (seconds)", ackTimeout, "Empty: the broker default"),
    ...limits.els,
    ...lifecycle.els,
    singleActive.el,
    messageGroups.el,
    dedup.el,
    args.el,
    h("button", { type: "submit" }, "Declare queue"),
  );
  onSubmit(form, async () => {
    const argumentsValue = args.read({}, { object: true });
    if (argumentsValue === undefined) return;
    if (singleActive.input.checked) argumentsValue[SINGLE_ACTIVE] = true;
    if (messageGroups.input.checked) argumentsValue[MESSAGE_GROUPS] = true;
    try {
      const r = await api("PUT", `/queues/${seg(name.value)}`, {
        body: {
          durable: durable.input.checked,
          max_delivery_count: optionalInt(maxDeliveries),
          dead_letter_queue: dlq.value.trim() || null,
          ack_timeout_seconds: optionalInt(ackTimeout),
          arguments: dedup.read(lifecycle.merge(limits.read(argumentsValue))),
        },
        withStatus: true,
      });
      ctx.notify(r.status === 201 ? `Queue ${r.data.name} declared` : `Queue ${r.data.name} already exists as declared`);
      name.value = "";
      lifecycle.clear();
      dedup.clear();
      refresh();
    } catch (error) {
      ctx.showError(error, "Declare queue");
    }
  });

  const filter = filterBox("Filter queues by name", () => {
    pages.reset();
    refresh();
  });
  fill(main, heading("Queues"), section("All queues", filter.el, list, pages.el), section("Declare a queue", form));

  const ticket = sequencer();
  async function refresh() {
    const current = ticket();
    try {
      const page = await api("GET", "/queues", { query: { limit: 50, after: pages.after, contains: filter.value } });
      if (!current()) return;
      pages.update(page.next_after);
      fill(list, page.items.length === 0
        ? h("p", null, filter.value ? "No queue names contain this text." : "No queues on this page.")
        : table("Queues with live counts", ["Name", "Ready", "Delayed", "In flight", "Dead", "Consumers", "Dead-letter queue"], page.items.map((q) => [
          link(q.name, "queues", q.name),
          String(q.stats.ready), String(q.stats.delayed), String(q.stats.in_flight), String(q.stats.dead), String(q.stats.consumers),
          q.dead_letter_queue ? link(q.dead_letter_queue, "queues", q.dead_letter_queue) : "—",
        ]), { class: "numeric" }));
    } catch (error) {
      ctx.showError(error, "Queues");
    }
  }
  refresh();
  return { refresh };
}

export function queueView(main, params, ctx) {
  const name = params.parts[1];
  const stats = h("div");
  const settings = h("div");
  const actions = h("div", { class: "actions" });
  const bindings = h("div");
  const browse = browser(name, ctx, () => refresh());
  const diagnosis = diagnosisPanel(name, ctx);
  const charts = historyCharts(`/queues/${seg(name)}/history`, ctx);
  fill(
    main,
    heading(`Queue ${name}`),
    h("p", null, link("All queues", "queues")),
    section("Diagnosis", diagnosis.el),
    section("Statistics", stats),
    section("Last 10 minutes", charts.el),
    section("Settings", settings),
    section("Actions", actions),
    section("Bindings to this queue", bindings, bindingForm(ctx, { queue: name }, () => loadBindings())),
    section("Messages", browse.el),
    section("Move, redrive or delete by filter", filterOperations(name, ctx, async () => {
      await Promise.all([refresh(), browse.load()]);
    })),
  );

  const ifEmpty = checkbox("Only if it is empty");
  const ifUnused = checkbox("Only if it has no consumers");
  fill(
    actions,
    h("a", { href: `${route("publish")}?queue=${encodeURIComponent(name)}`, class: "button" }, "Publish to this queue"),
    h("a", { href: `${route("consume")}?queue=${encodeURIComponent(name)}`, class: "button" }, "Consume from this queue"),
    button("Purge", () => confirmThen(`Remove every ready, delayed and dead message of ${name}?`, async () => {
      try {
        const r = await api("POST", `/queues/${seg(name)}/purge`);
        ctx.notify(`Purged ${r.purged} message${r.purged === 1 ? "" : "s"}`);
        await Promise.all([refresh(), browse.load()]);
      } catch (error) {
        ctx.showError(error, "Purge");
      }
    }), { class: "danger" }),
    h("div", { class: "delete-group" },
      ifEmpty.el,
      ifUnused.el,
      button("Delete queue", () => confirmThen(`Delete the queue ${name} with its messages and bindings?`, async () => {
        try {
          await api("DELETE", `/queues/${seg(name)}`, {
            query: { if_empty: ifEmpty.input.checked || null, if_unused: ifUnused.input.checked || null },
          });
          ctx.notify(`Queue ${name} deleted`);
          location.hash = route("queues");
        } catch (error) {
          ctx.showError(error, "Delete queue");
        }
      }), { class: "danger" }),
    ),
  );

  let loaded = false;
  let gone = false; // 404/403/422: stop polling, the error is shown once
  async function refresh() {
    if (gone) return;
    diagnosis.refresh();
    try {
      const q = await api("GET", `/queues/${seg(name)}`);
      fill(stats, statList([
        ...STATUSES.map((s) => [s, STATUS_LABELS[s], q.stats[s]]),
        ["consumers", "Consumers", q.stats.consumers],
        ...singleActiveStats(q),
      ], "queue-"));
      if (!loaded) {
        loaded = true;
        queueArgumentsSeen.set(name, q.arguments || {});
        const a = q.arguments || {};
        const dlx = a["x-dead-letter-exchange"];
        fill(settings, dl([
          ["Durable", yesNo(q.durable)],
          ["Maximum deliveries", q.max_delivery_count ?? "unlimited"],
          ["Dead-letter queue", q.dead_letter_queue ? link(q.dead_letter_queue, "queues", q.dead_letter_queue) : "none"],
          ["Ack timeout", q.ack_timeout_seconds === null ? "broker default" : `${q.ack_timeout_seconds} s`],
          ...limitRows(q.arguments),
          ["Ordered message groups (x-message-groups)", yesNo(a[MESSAGE_GROUPS] === true)],
          ["Message TTL (x-message-ttl)", a["x-message-ttl"] === undefined ? "none" : `${a["x-message-ttl"]} ms`],
          ["Queue expiry (x-expires)", a["x-expires"] === undefined ? "never" : `${a["x-expires"]} ms unused`],
          ["Dead-letter exchange (x-dead-letter-exchange)", dlx === undefined ? "none" : link(dlx, "exchanges", dlx)],
          ["Dead-letter routing key (x-dead-letter-routing-key)", a["x-dead-letter-routing-key"] ?? "the message's own"],
          [`Single active consumer (${SINGLE_ACTIVE})`, yesNo(q.arguments[SINGLE_ACTIVE] === true)],
          dedupRow(a),
          ["Arguments", pre(json(q.arguments), "Arguments")],
        ]));
        await Promise.all([loadBindings(), browse.load()]);
      }
    } catch (error) {
      if ([403, 404, 422].includes(error.status)) gone = true;
      ctx.showError(error, `Queue ${name}`);
    }
    if (!gone) await charts.refresh();
  }

  async function loadBindings() {
    await renderBindings(bindings, ctx, { queue: name }, loadBindings);
  }

  refresh();
  return { refresh };
}

/** Browse a queue's messages by status, keyset-paginated, with delete. */
function browser(queue, ctx, afterChange) {
  const status = h("select", { name: "status" }, h("option", { value: "" }, "All"), STATUSES.map((s) => h("option", { value: s }, STATUS_LABELS[s])));
  const size = h("select", { name: "limit" }, PAGE_SIZES.map((n) => h("option", { value: n, selected: n === 25 }, String(n))));
  const results = h("div", { "aria-live": "polite" });
  const pages = pager(() => load());
  const controls = h(
    "form",
    { class: "inline" },
    field("Status", status),
    field("Per page", size),
    h("button", { type: "submit" }, "Refresh"),
  );
  onSubmit(controls, async () => {
    pages.reset();
    await load();
  });
  status.addEventListener("change", () => {
    pages.reset();
    load();
  });
  size.addEventListener("change", () => {
    pages.reset();
    load();
  });

  const ticket = sequencer();
  async function load() {
    const current = ticket();
    try {
      const page = await api("GET", `/queues/${seg(queue)}/messages`, {
        query: { status: status.value, limit: size.value, after: pages.after },
      });
      if (!current()) return; // a newer load (another page, size or status) answers instead
      pages.update(page.next_after);
      fill(results, page.items.length === 0
        ? h("p", null, "No messages.")
        : h("ol", { class: "messages" }, page.items.map((m) => messageCard(m, queue, ctx, async () => {
          await Promise.all([load(), afterChange()]);
        }))));
    } catch (error) {
      if (current()) ctx.showError(error, "Browse");
    }
  }
  return { el: h("div", null, controls, results, pages.el), load };
}

function messageCard(m, queue, ctx, reload) {
  const properties = { ...(m.properties || {}) };
  delete properties.message_id; // shown on its own line
  const pairs = [
    ["Message id", m.message_id],
    ["Exchange", m.exchange === "" ? "(default)" : m.exchange],
    ["Routing key", m.routing_key],
    ["Deliveries", String(m.delivery_count)],
    priorityRow(m, queueArgumentsSeen.get(queue)),
    m.properties && m.properties.group_id !== undefined ? ["Group", h("code", { "aria-label": "Group id" }, m.properties.group_id)] : null,
    ["Created", formatTime(m.created_at)],
    m.available_at !== m.created_at ? ["Available", formatTime(m.available_at)] : null,
    expiryRow(m, queueArgumentsSeen.get(queue)),
    Object.keys(m.headers || {}).length ? ["Headers", h("code", { "aria-label": "Headers" }, JSON.stringify(m.headers))] : null,
    Object.keys(properties).length ? ["Properties", h("code", { "aria-label": "Properties" }, JSON.stringify(properties))] : null,
  ].filter(Boolean);
  return h(
    "li",
    { class: "message card", dataset: { status: m.status } },
    h("div", { class: "message-head" },
      h("strong", null, `#${m.id}`), " ",
      h("span", { class: `badge ${m.status}` }, STATUS_LABELS[m.status] || m.status),
      " ",
      button("Delete", () => confirmThen(`Delete message #${m.id}?`, async () => {
        try {
          await api("DELETE", `/queues/${seg(queue)}/messages/${encodeURIComponent(m.id)}`);
          ctx.notify(`Message #${m.id} deleted`);
          await reload();
        } catch (error) {
          ctx.showError(error, "Delete message");
        }
      }), { class: "danger small", "aria-label": `Delete message #${m.id}` }),
    ),
    h("dl", { class: "inline" }, pairs.map(([k, v]) => h("div", null, h("dt", null, k), h("dd", null, v)))),
    pre(bodyText(m), "Body"),
  );
}

// -- publish ---------------------------------------------------------------------------

const PUBLISH_TIMEOUT_MS = 15000;

export function publishView(main, params, ctx) {
  const presetQueue = params.query.get("queue");
  const targetName = nextId("target");
  const toExchange = h("input", { type: "radio", name: targetName, value: "exchange", id: nextId("r"), checked: !presetQueue });
  const toQueue = h("input", { type: "radio", name: targetName, value: "queue", id: nextId("r"), checked: Boolean(presetQueue) });
  const target = h("input", { name: "target", required: true, autocomplete: "off", value: presetQueue || params.query.get("exchange") || "" });
  const key = h("input", { name: "routing_key", autocomplete: "off" });
  const headers = jsonInput("Headers (JSON object)", "{}");
  const body = jsonInput("Body (any JSON value)", "{\n  \"hello\": \"world\"\n}");
  body.input.rows = 6;
  const delay = h("input", { name: "delay_ms", type: "number", min: 0, max: 604800000, value: 0, inputmode: "numeric" });
  const messageId = h("input", { name: "message_id", autocomplete: "off" });
  const priority = h("input", { name: "priority", type: "number", min: 0, max: 255, inputmode: "numeric" });
  const expiration = h("input", { name: "expiration", type: "number", min: 0, max: 4294967295, inputmode: "numeric" });
  const groupId = h("input", { name: "group_id", maxlength: 128, autocomplete: "off" });
  const mandatory = checkbox("Mandatory (refuse when no queue matches)");
  const result = h("div", { class: "result", role: "status", "aria-live": "polite" });
  const exchanges = datalist([]);
  const queues = datalist([]);
  namesOf("/exchanges").then((n) => append(exchanges.el, n.map((v) => h("option", { value: v }))));
  namesOf("/queues").then((n) => append(queues.el, n.map((v) => h("option", { value: v }))));
  const targetLabel = h("label", { for: nextId("t") });
  target.id = targetLabel.getAttribute("for");

  function syncTarget() {
    const queue = toQueue.checked;
    targetLabel.textContent = queue ? "Queue" : "Exchange";
    target.setAttribute("list", queue ? queues.id : exchanges.id);
    key.disabled = queue;
    mandatory.input.disabled = queue;
  }
  toExchange.addEventListener("change", syncTarget);
  toQueue.addEventListener("change", syncTarget);

  const form = h(
    "form",
    { class: "card" },
    h("fieldset", null,
      h("legend", null, "Publish to"),
      h("div", { class: "field check" }, toExchange, h("label", { for: toExchange.id }, "an exchange")),
      h("div", { class: "field check" }, toQueue, h("label", { for: toQueue.id }, "a queue (the default exchange)")),
    ),
    h("div", { class: "field" }, targetLabel, target),
    exchanges.el,
    queues.el,
    field("Routing key", key),
    headers.el,
    body.el,
    field("Delay (ms)", delay, "0 to 604800000 (7 days)"),
    field("Message id (optional)", messageId, "Empty: the broker makes a UUID"),
    field("Priority (optional)", priority, "0–255: claim order in a queue with x-max-priority"),
    field("Expiration (ms, optional)", expiration, "0–4294967295: time to live in each queue it reaches (the queue's x-message-ttl wins when smaller)"),
    field("Group id (optional)", groupId, "1–128 characters: one at a time, in order, in a queue with x-message-groups"),
    mandatory.el,
    h("button", { type: "submit" }, "Publish"),
  );
  syncTarget();

  onSubmit(form, async () => {
    const headersValue = headers.read({}, { object: true });
    if (headersValue === undefined) return;
    const bodyValue = body.read(null);
    if (bodyValue === undefined) return;
    const message = {
      body: bodyValue,
      headers: headersValue,
      delay_ms: Number(delay.value || 0),
    };
    if (messageId.value.trim()) message.properties = { message_id: messageId.value.trim() };
    if (optionalInt(priority) !== null) message.properties = { ...message.properties, priority: optionalInt(priority) };
    // a string of decimal digits, as in AMQP (contract §13); String(Number) also turns an
    // accepted "1e3" or "007" into "1000" or "7"
    if (optionalInt(expiration) !== null) message.properties = { ...message.properties, expiration: String(optionalInt(expiration)) };
    if (groupId.value !== "") message.properties = { ...message.properties, group_id: groupId.value };
    if (toQueue.checked) {
      message.queue = target.value;
    } else {
      message.exchange = target.value;
      message.routing_key = key.value;
      message.mandatory = mandatory.input.checked;
    }
    fill(result);
    try {
      const r = await withTimeout(ctx.messagex().publish(message), PUBLISH_TIMEOUT_MS);
      fill(result, r.routed
        ? h("p", { class: "notice ok" }, `Published: routed to ${r.queues.join(", ") || "no queue"}${refusedText(r)} (message id ${r.message_id})`)
        : h("p", { class: "notice warn" }, `Published but not routed: no queue matched (message id ${r.message_id})`));
    } catch (error) {
      fill(result, h("p", { class: "notice error" }, `Not published: ${error.message}${error.code ? ` (${error.code})` : ""}`));
    }
  });

  fill(main, heading("Publish a message"), h("p", { class: "hint" }, "Sent over the WebSocket; the broker answers once the message is committed."), form, result);
  return {};
}

function withTimeout(promise, ms) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error("no answer from the broker in time"), { code: "timeout" })), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// -- users -----------------------------------------------------------------------------

export function usersView(main, _params, ctx) {
  const list = h("div");
  const pages = pager(() => refresh());
  const username = h("input", { name: "username", required: true, autocomplete: "off" });
  const password = h("input", { name: "password", type: "password", autocomplete: "new-password" });
  const role = h("select", { name: "role" }, h("option", { value: "user" }, "user"), h("option", { value: "admin" }, "admin"));
  const perms = {
    configure: h("input", { name: "configure", autocomplete: "off", class: "code" }),
    write: h("input", { name: "write", autocomplete: "off", class: "code" }),
    read: h("input", { name: "read", autocomplete: "off", class: "code" }),
  };
  const form = h(
    "form",
    { class: "card" },
    field("Username", username),
    field("Password", password, "Required for a new user; leave empty to keep the current one"),
    field("Role", role),
    h("fieldset", null,
      h("legend", null, "Permissions (regular expressions matched in full against names; empty allows nothing; .* allows all)"),
      field("Configure", perms.configure, "Declare, delete and purge"),
      field("Write", perms.write, "Publish; bind to a queue"),
      field("Read", perms.read, "Consume, get, browse; bind from an exchange"),
    ),
    h("button", { type: "submit" }, "Save user"),
  );
  onSubmit(form, async () => {
    const body = {
      role: role.value,
      permissions: { configure: perms.configure.value, write: perms.write.value, read: perms.read.value },
    };
    if (password.value) body.password = password.value;
    try {
      const r = await api("PUT", `/users/${seg(username.value)}`, { body, withStatus: true });
      ctx.notify(r.status === 201 ? `User ${r.data.username} created` : `User ${r.data.username} updated`);
      password.value = "";
      refresh();
    } catch (error) {
      ctx.showError(error, "Save user");
    }
  });

  function edit(u) {
    username.value = u.username;
    password.value = "";
    role.value = u.role;
    for (const k of Object.keys(perms)) perms[k].value = u.permissions[k];
    username.focus();
  }

  const filter = filterBox("Filter users by name", () => {
    pages.reset();
    refresh();
  });
  fill(main, heading("Users"), section("All users", filter.el, list, pages.el), section("Create or update a user", form));

  const ticket = sequencer();
  async function refresh() {
    const current = ticket();
    try {
      const page = await api("GET", "/users", { query: { limit: 100, after: pages.after, contains: filter.value } });
      if (!current()) return;
      pages.update(page.next_after);
      fill(list, table("Users", ["Username", "Role", "Configure", "Write", "Read", "Actions"], page.items.map((u) => [
        u.username, u.role,
        h("code", null, u.permissions.configure), h("code", null, u.permissions.write), h("code", null, u.permissions.read),
        h("div", { class: "row-actions" },
          button("Edit", () => edit(u), { "aria-label": `Edit ${u.username}` }),
          button("Delete", () => confirmThen(`Delete the user ${u.username}? Their sessions and WebSockets end at once.`, async () => {
            try {
              await api("DELETE", `/users/${seg(u.username)}`);
              ctx.notify(`User ${u.username} deleted`);
              refresh();
            } catch (error) {
              ctx.showError(error, "Delete user");
            }
          }), { class: "danger", "aria-label": `Delete ${u.username}` }),
        ),
      ])));
    } catch (error) {
      ctx.showError(error, "Users");
    }
  }
  refresh();
  return {};
}
