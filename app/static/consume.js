// The live consume panel: subscribe over the WebSocket (messagex.js), watch deliveries
// arrive, settle each with ACK / NACK. Subscriptions and unsettled deliveries live for the
// whole session, so leaving the page and coming back loses nothing.

import { h, fill, append, field, formatTime, nextId } from "./dom.js";
import { api } from "./api.js";
import { bodyText } from "./views.js";

const MAX_KEPT = 500; // settled entries beyond this are dropped, oldest first

const state = {
  subs: new Map(), // queue -> Subscription
  entries: [], // {message, outcome: null | "acked" | "requeued" | ... | "stale", error, el}
  mounted: null, // {subsList, deliveries, counter, conn} while the page is shown
  listening: null, // the client whose events we follow
};

export function resetConsumer() {
  state.subs.clear();
  state.entries = [];
  state.mounted = null;
  state.listening = null;
}

function listen(mx, ctx) {
  if (state.listening === mx) return;
  state.listening = mx;
  mx.addEventListener("cancelled", (e) => {
    state.subs.delete(e.detail.queue);
    ctx.notify(`Subscription to ${e.detail.queue} ended (${e.detail.reason})`, "error");
    renderSubs(ctx);
  });
  mx.addEventListener("activated", (e) => {
    ctx.notify(`Subscription to ${e.detail.queue} is now the single active consumer`);
    renderSubs(ctx);
  });
  mx.addEventListener("state", (e) => {
    if (e.detail.state === "reconnecting") {
      // The broker released this connection's deliveries; they will come again.
      for (const entry of state.entries) {
        if (!entry.outcome) setOutcome(entry, "stale", "connection lost: the broker redelivers it");
      }
    }
    renderConnection(mx);
  });
}

function onDelivery(message) {
  const entry = { message, outcome: null, error: null, el: null };
  state.entries.push(entry);
  prune();
  if (state.mounted) {
    entry.el = deliveryCard(entry);
    state.mounted.deliveries.append(entry.el);
    state.mounted.empty.hidden = true;
  }
  renderCounter();
}

function prune() {
  let excess = state.entries.length - MAX_KEPT;
  if (excess <= 0) return;
  state.entries = state.entries.filter((entry) => {
    if (excess > 0 && entry.outcome) {
      excess -= 1;
      if (entry.el) entry.el.remove();
      return false;
    }
    return true;
  });
}

function unsettled() {
  return state.entries.filter((e) => !e.outcome).length;
}

function renderCounter() {
  if (!state.mounted) return;
  const n = unsettled();
  state.mounted.counter.textContent = `${n} unsettled deliver${n === 1 ? "y" : "ies"}, ${state.entries.length - n} settled`;
}

function renderConnection(mx) {
  if (!state.mounted) return;
  const labels = {
    idle: "Not connected",
    connecting: "Connecting…",
    open: "Connected",
    reconnecting: "Connection lost — reconnecting (subscriptions resume automatically)",
    closed: "Closed",
  };
  state.mounted.conn.textContent = labels[mx.state] || mx.state;
  state.mounted.conn.dataset.state = mx.state;
}

function setOutcome(entry, outcome, error = null) {
  entry.outcome = outcome;
  entry.error = error;
  if (entry.el) {
    const fresh = deliveryCard(entry);
    const hadFocus = entry.el.contains(document.activeElement);
    entry.el.replaceWith(fresh);
    entry.el = fresh;
    if (hadFocus) fresh.querySelector(".outcome").focus();
  }
  renderCounter();
}

async function settle(entry, action) {
  try {
    const outcome = action === "ack" ? (await entry.message.ack(), "acked") : await entry.message.nack({ requeue: action === "requeue" });
    setOutcome(entry, outcome);
  } catch (error) {
    setOutcome(entry, error.code === "stale_delivery" ? "stale" : "failed", `${error.message} (${error.code || "error"})`);
  }
}

function deliveryCard(entry) {
  const m = entry.message;
  const label = `${m.queue} #${m.delivery_count}`;
  const properties = { ...m.properties };
  delete properties.message_id; // shown on its own
  const buttons = entry.outcome
    ? h("p", { class: `outcome ${entry.outcome}`, tabindex: "-1" }, `Settled: ${entry.outcome}`, entry.error ? ` — ${entry.error}` : "")
    : h("div", { class: "row-actions" },
      h("button", { type: "button", class: "ok", onClick: () => settle(entry, "ack"), "aria-label": `ACK delivery ${m.delivery_tag}` }, "ACK"),
      h("button", { type: "button", onClick: () => settle(entry, "requeue"), "aria-label": `NACK (requeue) delivery ${m.delivery_tag}` }, "NACK (requeue)"),
      h("button", { type: "button", class: "danger", onClick: () => settle(entry, "reject"), "aria-label": `Reject delivery ${m.delivery_tag} (no requeue)` }, "Reject"),
    );
  return h(
    "li",
    { class: `delivery card${entry.outcome ? " settled" : ""}`, dataset: { tag: m.delivery_tag } },
    h("div", { class: "message-head" },
      h("strong", null, m.queue), " ",
      m.redelivered ? h("span", { class: "badge dead" }, `redelivered (${m.delivery_count})`) : h("span", { class: "badge ready" }, "new"),
    ),
    h("dl", { class: "inline" }, [
      ["Delivery tag", m.delivery_tag],
      ["Message id", m.message_id],
      ["Exchange", m.exchange === "" ? "(default)" : m.exchange],
      ["Routing key", m.routing_key],
      ["Created", formatTime(m.created_at)],
      Object.keys(m.headers).length ? ["Headers", h("code", { "aria-label": "Headers" }, JSON.stringify(m.headers))] : null,
      Object.keys(properties).length ? ["Properties", h("code", { "aria-label": "Properties" }, JSON.stringify(properties))] : null,
    ].filter(Boolean).map(([k, v]) => h("div", null, h("dt", null, k), h("dd", null, v)))),
    h("pre", { class: "code", tabindex: "0", "aria-label": `Body of ${label}` }, bodyText(m)),
    buttons,
  );
}

function renderSubs(ctx) {
  if (!state.mounted) return;
  const items = [...state.subs.values()].map((sub) =>
    h("li", null,
      h("span", null, `${sub.queue} (prefetch ${sub.prefetch})`), " ",
      sub.waiting ? h("span", { class: "hint" }, "waiting: another subscription is the single active consumer ") : null,
      h("button", {
        type: "button",
        onClick: async () => {
          try {
            await sub.unsubscribe();
            state.subs.delete(sub.queue);
            ctx.notify(`Unsubscribed from ${sub.queue}; its unsettled deliveries are still yours to settle`);
          } catch (error) {
            ctx.showError(error, "Unsubscribe");
          }
          renderSubs(ctx);
        },
        "aria-label": `Unsubscribe from ${sub.queue}`,
      }, "Unsubscribe"),
    ));
  fill(state.mounted.subsList, items.length ? h("ul", { class: "subs" }, items) : h("p", null, "No subscriptions."));
}

export function consumeView(main, params, ctx) {
  const mx = ctx.messagex();
  listen(mx, ctx);

  const queue = h("input", { name: "queue", required: true, autocomplete: "off", value: params.query.get("queue") || "" });
  const prefetch = h("input", { name: "prefetch", type: "number", min: 1, max: 1000, value: 10, required: true, inputmode: "numeric" });
  const names = h("datalist", { id: nextId("dl") });
  queue.setAttribute("list", names.id);
  api("GET", "/queues", { query: { limit: 1000 } })
    .then((page) => append(names, page.items.map((q) => h("option", { value: q.name }))))
    .catch(() => {});
  const form = h(
    "form",
    { class: "card inline" },
    field("Queue", queue),
    names,
    field("Prefetch", prefetch, "Unacknowledged deliveries held at once (1–1000)"),
    h("button", { type: "submit" }, "Subscribe"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const name = queue.value.trim();
    if (state.subs.has(name)) {
      ctx.notify(`Already subscribed to ${name}`, "error");
      return;
    }
    const submit = form.querySelector("button[type=submit]");
    submit.disabled = true;
    try {
      const sub = await mx.subscribe(name, { prefetch: Number(prefetch.value) }, onDelivery);
      state.subs.set(name, sub);
      ctx.notify(`Subscribed to ${name}`);
      renderSubs(ctx);
    } catch (error) {
      ctx.showError(error, "Subscribe");
    } finally {
      submit.disabled = false;
    }
  });

  const conn = h("p", { class: "conn", role: "status" });
  const subsList = h("div");
  const counter = h("p", { role: "status", "aria-live": "polite" });
  const empty = h("p", null, "No deliveries yet.");
  const deliveries = h("ol", { class: "deliveries", "aria-label": "Deliveries" });
  const clearSettled = h("button", {
    type: "button",
    onClick: () => {
      for (const entry of state.entries) if (entry.outcome && entry.el) entry.el.remove();
      state.entries = state.entries.filter((e) => !e.outcome);
      empty.hidden = state.entries.length > 0;
      renderCounter();
    },
  }, "Clear settled");

  const subsId = nextId("s");
  const delId = nextId("s");
  fill(
    main,
    h("h1", { tabindex: "-1" }, "Consume"),
    h("p", { class: "hint" }, "A live WebSocket consumer: deliveries stay yours until you ACK or NACK them (or the queue's ack timeout passes)."),
    conn,
    form,
    h("section", { "aria-labelledby": subsId }, h("h2", { id: subsId }, "Subscriptions"), subsList),
    h("section", { "aria-labelledby": delId }, h("h2", { id: delId }, "Deliveries"), counter, clearSettled, empty, deliveries),
  );
  state.mounted = { subsList, deliveries, counter, conn, empty };
  for (const entry of state.entries) {
    entry.el = deliveryCard(entry);
    deliveries.append(entry.el);
  }
  empty.hidden = state.entries.length > 0;
  renderSubs(ctx);
  renderCounter();
  renderConnection(mx);
  return {
    dispose() {
      for (const entry of state.entries) entry.el = null;
      state.mounted = null;
    },
  };
}
