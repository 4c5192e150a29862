// Diagnosis (contract §19) and connections (§20): a queue's diagnosis panel, the admin
// "Health" page (the database's side) and the admin "Connections" page. Every finding is
// shown first, most severe first, with its message (what it means and what to do).

import { api, seg } from "./api.js";
import { h, fill, dl, table, formatTime, link, nextId, filterBox } from "./dom.js";

const BLOCKED = {
  null: "nothing: it is delivered as soon as a subscriber has credit",
  delay: "its delay has not passed yet",
  group: "a copy of its group is in flight",
  single_active_consumer: "the single active consumer is being handed over",
  no_subscriber_with_credit: "no subscriber has free prefetch",
};

function heading(text) {
  return h("h1", { tabindex: "-1" }, text);
}

function section(title, ...children) {
  const id = nextId("s");
  return h("section", { "aria-labelledby": id }, h("h2", { id }, title), children);
}

/** The findings as a list: severity, code, then the explanation and what to do. */
export function findingList(findings) {
  if (!findings.length) return h("p", { class: "findings-none" }, "No findings: nothing looks wrong.");
  return h(
    "ul",
    { class: "findings" },
    findings.map((f) =>
      h(
        "li",
        { class: `finding ${f.severity}`, dataset: { code: f.code } },
        h("strong", null, `${f.severity}: ${f.code}`),
        " — ",
        f.message,
      ),
    ),
  );
}

function holderText(holder) {
  const who = holder.username ? `user ${holder.username}` : "unknown user";
  const where = holder.kind === "pull" ? "a pull consumer" : `connection ${holder.connection_id}`;
  return `${who}, ${where}, process ${holder.process || "?"}`;
}

/** A queue's diagnosis panel: {el, refresh}. */
export function diagnosisPanel(name, ctx) {
  const el = h("div", { class: "diagnosis", "aria-live": "polite" });
  let failed = false;
  async function refresh() {
    if (failed) return;
    try {
      const d = await api("GET", `/queues/${seg(name)}/diagnosis`);
      const head = d.head;
      const held = d.oldest_in_flight;
      fill(
        el,
        findingList(d.findings),
        dl([
          ["Head", head
            ? `#${head.id} (${head.message_id}), ${head.status}, ${head.age_ms} ms old, delivered ${head.delivery_count}×${head.group_id ? `, group ${head.group_id}` : ""}`
            : "none: no ready or delayed copy"],
          ["Head blocked by", head ? `${head.blocked_by ?? "nothing"} — ${BLOCKED[head.blocked_by]}${head.blocking_group ? ` (group ${head.blocking_group})` : ""}` : "—"],
          ["Oldest delivery in flight", held
            ? `#${held.id} (${held.message_id}) since ${formatTime(held.delivered_at)}, released at ${formatTime(held.expires_at)}; held by ${holderText(held.holder)}`
            : "none"],
        ], { class: "diagnosis-facts" }),
        d.consumers.length
          ? table(
            "Subscriptions",
            ["Connection", "User", "Process", "Prefetch", "Unacked", "Active", "Since", "Last settlement"],
            d.consumers.map((c) => [
              c.connection_id, c.username ?? "", c.process, String(c.prefetch), String(c.unacked),
              c.active ? "yes" : "waiting", formatTime(c.since), c.last_ack_at ? formatTime(c.last_ack_at) : "none yet",
            ]),
          )
          : h("p", null, "No WebSocket subscription."),
      );
    } catch (error) {
      if ([403, 404].includes(error.status)) failed = true;
      ctx.showError(error, "Diagnosis");
    }
  }
  return { el, refresh };
}

/** Admin: the database's side of the broker's health. */
export function healthView(main, _params, ctx) {
  const findings = h("div", { "aria-live": "polite" });
  const database = h("div");
  const processes = h("div");
  fill(
    main,
    heading("Health"),
    h("p", null, "The database's side of the broker: each finding says what it means and what to do (docs/operations.md has the runbook)."),
    section("Findings", findings),
    section("Database", database),
    section("Broker processes", processes),
  );
  async function refresh() {
    try {
      const d = await api("GET", "/diagnosis");
      fill(findings, findingList(d.findings));
      const b = d.bloat;
      fill(database, dl([
        ["Messages table: live tuples", b ? String(b.live_tuples) : "unknown"],
        ["Messages table: dead tuples", b ? String(b.dead_tuples) : "unknown"],
        ["Last autovacuum", b && b.last_autovacuum ? formatTime(b.last_autovacuum) : "never"],
        ["NOTIFY queue use", `${(d.notify_queue_usage * 100).toFixed(1)} %`],
      ]), d.xmin_held.length
        ? table("Oldest transactions and slots holding back cleanup", ["Kind", "PID", "Application", "State", "Age"],
          d.xmin_held.map((x) => [x.kind === "transaction" ? "transaction" : `slot ${x.slot_name}`, String(x.pid ?? ""), x.application_name ?? "", x.state ?? "", x.age_ms === null ? `${x.xmin_age} transactions` : `${(x.age_ms / 1000).toFixed(1)} s`]))
        : h("p", null, "No open transaction holds back cleanup."));
      fill(processes, table("Broker processes", ["Process", "Host", "PID", "Heartbeat", "LISTEN", "Pool in use"],
        d.processes.map((p) => [p.id, p.hostname, String(p.pid), `${(p.heartbeat_age_ms / 1000).toFixed(1)} s ago`, p.listening ? "up" : "down", p.pool_size ? `${p.pool_in_use}/${p.pool_size}` : "?"])));
    } catch (error) {
      ctx.showError(error, "Health");
    }
  }
  refresh();
  return { refresh };
}

/** Admin: every WebSocket connection on every process, with a close button each. */
export function connectionsView(main, _params, ctx) {
  const list = h("div", { "aria-live": "polite" });
  // ?contains= (contract §20): a case-sensitive part of the username
  const filter = filterBox("Filter connections by user", () => refresh());
  fill(main, heading("Connections"), h("p", null, "WebSocket connections on every broker process."), filter.el, list);
  async function refresh() {
    try {
      const query = { limit: 1000 };
      if (filter.value) query.contains = filter.value;
      const page = await api("GET", "/connections", { query });
      fill(list, page.items.length === 0
        ? h("p", null, "No WebSocket connection.")
        : table("Connections", ["Connection", "User", "From", "Process", "Connected", "Subscriptions", ""],
          page.items.map((c) => [
            c.connection_id, c.username, c.client_address ?? "", c.process, formatTime(c.connected_at),
            c.subscriptions.length
              ? h("ul", null, c.subscriptions.map((s) => h("li", null, link(s.queue, "queues", s.queue), ` prefetch ${s.prefetch}, unacked ${s.unacked}${s.active ? "" : ", waiting"}`)))
              : "none",
            h("button", {
              type: "button",
              class: "danger",
              "aria-label": `Close connection ${c.connection_id}`,
              onClick: async () => {
                if (!window.confirm(`Close the connection ${c.connection_id} of ${c.username}? Its deliveries return to their queues.`)) return;
                try {
                  await api("DELETE", `/connections/${seg(c.connection_id)}`);
                  ctx.notify(`Connection ${c.connection_id} closed`);
                  await refresh();
                } catch (error) {
                  ctx.showError(error, "Close connection");
                }
              },
            }, "Close"),
          ])));
    } catch (error) {
      ctx.showError(error, "Connections");
    }
  }
  refresh();
  return { refresh };
}
