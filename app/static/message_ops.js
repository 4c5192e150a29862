// A queue page's "by filter" form (contract §17): the filter's fields, a dry-run count, and
// move / redrive / delete after a confirmation that names the counted copies. Every value
// from the broker is rendered as text.

import { api, seg } from "./api.js";
import { h, fill, field, checkbox, nextId } from "./dom.js";

const MOVABLE = [["ready", "Ready"], ["delayed", "Delayed"], ["dead", "Dead"]];
const REASONS = ["rejected", "expired", "maxlen", "delivery_limit"];
const ACTIONS = {
  move: "Move to a queue",
  redrive: "Redrive (back to each copy's x-death queue)",
  delete: "Delete",
};

function plural(n, word) {
  if (n === 1) return `1 ${word}`;
  return `${n} ${word.endsWith("y") ? `${word.slice(0, -1)}ies` : `${word}s`}`;
}

function matching(n) {
  return `${plural(n, "copy")} ${n === 1 ? "matches" : "match"}`;
}

/** The filter form's fields and a reader: read() → {filter} or {error}. */
function filterFields() {
  const statuses = MOVABLE.map(([value, label]) => [value, checkbox(label, { checked: true, value })]);
  const routingKey = h("input", { type: "text", name: "routing_key", placeholder: "order.#", autocomplete: "off" });
  const headers = h("textarea", { rows: 2, spellcheck: "false", class: "code", name: "headers", placeholder: '{"tenant": "acme"}' });
  const ids = h("textarea", { rows: 2, spellcheck: "false", class: "code", name: "message_ids", placeholder: "one message id a line" });
  const after = h("input", { type: "datetime-local", step: "1", name: "published_after" });
  const before = h("input", { type: "datetime-local", step: "1", name: "published_before" });
  const minCount = h("input", { type: "number", min: "0", step: "1", name: "min_delivery_count" });
  const reason = h("select", { name: "death_reason" }, h("option", { value: "" }, "Any"), REASONS.map((r) => h("option", { value: r }, r)));
  const statusGroup = h("fieldset", { class: "inline" }, h("legend", null, "Status"), statuses.map(([, c]) => c.el));
  const el = h(
    "div",
    null,
    statusGroup,
    field("Topic pattern", routingKey, "Matched against the routing key: * one word, # zero or more"),
    field("Headers (JSON object)", headers, "Every pair equal, as a headers binding with x-match all"),
    field("Message ids", ids),
    field("Published after", after),
    field("Published before", before),
    field("Minimum deliveries", minCount),
    field("Newest x-death reason", reason),
  );

  function read() {
    const filter = {};
    const chosen = statuses.filter(([, c]) => c.input.checked).map(([value]) => value);
    if (chosen.length === 0) return { error: "Choose at least one status." };
    if (chosen.length < MOVABLE.length) filter.status = chosen;
    if (routingKey.value !== "") filter.routing_key = routingKey.value;
    if (headers.value.trim() !== "") {
      let parsed;
      try {
        parsed = JSON.parse(headers.value);
      } catch (e) {
        return { error: `Headers: not valid JSON: ${e.message}` };
      }
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
        return { error: "Headers: give a JSON object." };
      }
      filter.headers = parsed;
    }
    const idList = ids.value.split(/[\n,]/).map((s) => s.trim()).filter(Boolean);
    if (idList.length) filter.message_ids = idList;
    for (const [input, key] of [[after, "published_after"], [before, "published_before"]]) {
      if (input.value) filter[key] = new Date(input.value).toISOString();
    }
    if (minCount.value !== "") filter.min_delivery_count = Number(minCount.value);
    if (reason.value) filter.death_reason = reason.value;
    return { filter };
  }
  return { el, read };
}

/**
 * The form for queue `queue`. `afterChange()` reloads the page's stats and browser.
 * @returns {HTMLElement}
 */
export function filterOperations(queue, ctx, afterChange) {
  const fields = filterFields();
  const action = h("select", { name: "action" }, Object.entries(ACTIONS).map(([v, label]) => h("option", { value: v }, label)));
  const listId = nextId("dl");
  const target = h("input", { type: "text", name: "to", list: listId, autocomplete: "off" });
  const targetField = field("Target queue", target);
  const limit = h("input", { type: "number", min: "1", max: "100000", step: "1", value: "1000", name: "limit" });
  const result = h("p", { role: "status", class: "filter-result" });
  const form = h(
    "form",
    { class: "filter-ops", "aria-label": "Operations by filter" },
    fields.el,
    field("Action", action),
    targetField,
    field("At most", limit, "copies (1-100000) in one transaction; in-flight copies are never touched"),
    h("datalist", { id: listId }),
    h("div", { class: "actions" },
      h("button", { type: "button", "data-op": "count" }, "Count (dry run)"),
      h("button", { type: "submit", class: "danger" }, "Apply…"),
    ),
    result,
  );
  const syncTarget = () => {
    targetField.style.display = action.value === "move" ? "" : "none";
  };
  action.addEventListener("change", syncTarget);
  syncTarget();
  api("GET", "/queues", { query: { limit: 1000 } })
    .then((page) => fill(form.querySelector(`#${listId}`), page.items.map((q) => h("option", { value: q.name }))))
    .catch(() => {});

  function request(dryRun) {
    const read = fields.read();
    if (read.error) {
      fill(result, read.error);
      return null;
    }
    const n = Number(limit.value);
    if (!Number.isInteger(n) || n < 1 || n > 100000) {
      fill(result, "At most: a whole number from 1 to 100000.");
      return null;
    }
    const op = action.value === "delete" ? "delete" : "move";
    const body = { filter: read.filter, limit: n, dry_run: dryRun };
    if (op === "move") {
      if (action.value === "move" && target.value.trim() === "") {
        fill(result, "Name the target queue.");
        return null;
      }
      body.to = action.value === "move" ? target.value.trim() : null;
    }
    return { op, body };
  }

  async function send(req) {
    return api("POST", `/queues/${seg(queue)}/messages/${req.op}`, { body: req.body });
  }

  function describe(r, req) {
    if (req.op === "delete") return `${matching(r.matched)}; up to ${Math.min(r.matched, req.body.limit)} would be deleted.`;
    const skipped = r.skipped ? `, ${r.skipped} of them without a queue to return to` : "";
    return `${matching(r.matched)}${skipped}; up to ${Math.min(r.matched - r.skipped, req.body.limit)} would be moved.`;
  }

  form.querySelector("[data-op=count]").addEventListener("click", async () => {
    const req = request(true);
    if (!req) return;
    try {
      fill(result, describe(await send(req), req));
    } catch (error) {
      ctx.showError(error, "Count");
    }
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const submit = form.querySelector("button[type=submit]");
    const req = request(true);
    if (!req) return;
    submit.disabled = true;
    try {
      const counted = await send(req);
      fill(result, describe(counted, req));
      if (counted.matched === 0) return;
      const where = req.op === "delete" ? "" : req.body.to === null ? " back to their x-death queues" : ` to ${req.body.to}`;
      const verb = req.op === "delete" ? "Delete" : "Move";
      const question = `${verb} up to ${Math.min(counted.matched, req.body.limit)} of ${plural(counted.matched, "matching copy")} of ${queue}${where}?`;
      if (!window.confirm(question)) return;
      const done = await send({ op: req.op, body: { ...req.body, dry_run: false } });
      const text = req.op === "delete"
        ? `Deleted ${plural(done.deleted, "copy")} of ${done.matched} matching.`
        : `Moved ${plural(done.moved, "copy")} of ${done.matched} matching${done.skipped ? `; ${done.skipped} skipped` : ""}.`;
      fill(result, text);
      ctx.notify(text);
      await afterChange();
    } catch (error) {
      ctx.showError(error, ACTIONS[action.value]);
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}
