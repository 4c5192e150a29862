// messagex.js — a small browser client for the MessageX WebSocket protocol.
//
//   import { connect } from "/static/messagex.js";
//   const mx = await connect({ token });                  // or { username, password }
//   await mx.subscribe("invoices", { prefetch: 10 }, async (message) => {
//     console.log(message.body);
//     await message.ack();                                // or message.nack({ requeue: false })
//   });
//   const { routed, queues } = await mx.publish({ exchange: "orders", routing_key: "order.created",
//                                                body: { id: 42 } });
//   await mx.declareExchange("orders", { type: "topic", alternateExchange: "unrouted" });
//   await mx.bind({ exchange: "orders", destination_exchange: "audit", routing_key: "#" });
//
// One WebSocket per client. Every request frame carries an `id`, and the server answers each
// with exactly one frame carrying that id (the success frame or ERROR), so every call here
// returns a promise that settles with that reply. When the socket drops, the client
// reconnects with exponential backoff (full jitter), authenticates again and resubscribes
// every subscription; deliveries received on the old socket can no longer be settled (the
// broker has already released them for redelivery), so their ack()/nack() reject with
// `stale_delivery`. A publish whose reply was lost with the socket rejects with
// `connection_lost`: it may or may not have been stored (set properties.message_id to
// de-duplicate a retry). Authentication failures (close code 4401) are final: no reconnect.
//
// Events (the client is an EventTarget): "state" {state, attempt?, delayMs?},
// "connected" {connection_id, user}, "cancelled" {queue, reason}, "error" {error},
// "activated" {queue} (a subscription that waited on a single-active-consumer queue is now
// the active one: Subscription.waiting turned false).

const CLOSE_UNAUTHORIZED = 4401;

export class MessageXError extends Error {
  constructor(code, message, frame) {
    super(message || code);
    this.name = "MessageXError";
    this.code = code;
    this.frame = frame || null;
  }
}

function defaultUrl() {
  const scheme = globalThis.location?.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${globalThis.location?.host}/api/v1/ws`;
}

function restAuthorization(auth) {
  if (auth.token) return `Bearer ${auth.token}`;
  const bytes = new TextEncoder().encode(`${auth.username}:${auth.password}`);
  return `Basic ${btoa(String.fromCharCode(...bytes))}`;
}

/** A delivery. `body` is the JSON body, or null when the message is binary (`body_base64`). */
export class Message {
  constructor(client, generation, frame) {
    this._client = client;
    this._generation = generation;
    this.queue = frame.queue;
    this.exchange = frame.exchange;
    this.routing_key = frame.routing_key;
    this.body = "body" in frame ? frame.body : null;
    this.body_base64 = frame.body_base64 ?? null;
    this.headers = frame.headers ?? {};
    this.properties = frame.properties ?? {};
    this.message_id = frame.message_id;
    this.delivery_tag = frame.delivery_tag;
    this.delivery_count = frame.delivery_count;
    this.redelivered = Boolean(frame.redelivered);
    this.created_at = frame.created_at;
    this.settled = false;
  }

  /** Acknowledge: resolves on ACKED (the message is deleted). */
  async ack() {
    const reply = await this._settle({ type: "ACK", delivery_tag: this.delivery_tag });
    return reply.delivery_tag;
  }

  /** Reject: resolves with the outcome — "requeued", "dead_lettered", "dead" or "discarded". */
  async nack({ requeue = true } = {}) {
    const reply = await this._settle({
      type: "NACK",
      delivery_tag: this.delivery_tag,
      requeue: Boolean(requeue),
    });
    return reply.outcome;
  }

  async _settle(frame) {
    if (this._generation !== this._client._generation || this._client.state !== "open") {
      throw new MessageXError(
        "stale_delivery",
        "this delivery came on a connection that has closed; the broker redelivers it",
      );
    }
    const reply = await this._client._request(frame);
    this.settled = true;
    return reply;
  }
}

export class Subscription {
  constructor(client, queue, prefetch, handler) {
    this._client = client;
    this.queue = queue;
    this.prefetch = prefetch;
    this.handler = handler;
    this.confirmed = false; // SUBSCRIBED seen at least once: resubscribe after a reconnect
    this.active = true;
    // On a queue declared with x-single-active-consumer: true while another subscription is
    // the active one (SUBSCRIBED said "active": false); false once SUBSCRIPTION_ACTIVE came
    // (the client then dispatches "activated" {queue}). Always false on other queues.
    this.waiting = false;
  }

  /** Stop new deliveries (unsettled ones stay yours to settle). */
  async unsubscribe() {
    if (!this.active) return;
    this.active = false;
    try {
      if (this._client.state === "open") {
        await this._client._request({ type: "UNSUBSCRIBE", queue: this.queue });
      }
    } catch (e) {
      if (!(e instanceof MessageXError) || !["not_subscribed", "connection_lost"].includes(e.code)) {
        throw e;
      }
    } finally {
      if (this._client._subs.get(this.queue) === this) this._client._subs.delete(this.queue);
    }
  }
}

/** declareQueue's options and the §13/§15 queue arguments they stand for (RabbitMQ's names). */
const QUEUE_ARGUMENTS = [
  ["messageTtl", "x-message-ttl"],
  ["expires", "x-expires"],
  ["maxLength", "x-max-length"],
  ["maxLengthBytes", "x-max-length-bytes"],
  ["overflow", "x-overflow"],
  ["maxPriority", "x-max-priority"],
  ["singleActiveConsumer", "x-single-active-consumer"],
  ["messageGroups", "x-message-groups"],
  ["deadLetterExchange", "x-dead-letter-exchange"],
  ["deadLetterRoutingKey", "x-dead-letter-routing-key"],
  ["deduplicationWindowSeconds", "x-deduplication-window-seconds"],
];

export class Client extends EventTarget {
  /**
   * @param {object} options
   * @param {string} [options.url] ws:// or wss:// URL of /api/v1/ws (default: this page's origin)
   * @param {string} [options.token] a session token from POST /api/v1/auth/login
   * @param {string} [options.username]
   * @param {string} [options.password]
   * @param {number} [options.minBackoffMs=250] first reconnect delay (doubles up to max)
   * @param {number} [options.maxBackoffMs=10000]
   * @param {number} [options.requestTimeoutMs=30000] how long to wait for a reply
   * @param {number} [options.pingIntervalMs=25000] PING this often; no PONG in time: reconnect
   */
  constructor(options = {}) {
    super();
    this.url = options.url || defaultUrl();
    this._auth = options.token
      ? { token: options.token }
      : { username: options.username, password: options.password };
    this.minBackoffMs = options.minBackoffMs ?? 250;
    this.maxBackoffMs = options.maxBackoffMs ?? 10000;
    this.requestTimeoutMs = options.requestTimeoutMs ?? 30000;
    this.pingIntervalMs = options.pingIntervalMs ?? 25000;
    this.state = "idle"; // idle | connecting | open | reconnecting | closed
    this.user = null;
    this.connectionId = null;
    this._ws = null;
    this._generation = 0;
    this._nextId = 1;
    this._pending = new Map(); // id -> {resolve, reject, timer}
    this._subs = new Map(); // queue -> Subscription
    this._openWaiters = [];
    this._attempt = 0;
    this._reconnectTimer = null;
    this._pingTimer = null;
    this._finalError = null;
  }

  /** Open the connection; resolves once authenticated (CONNECTED). */
  connect() {
    if (this.state === "closed") return Promise.reject(this._closedError());
    const ready = this._waitOpen().then(() => ({ connection_id: this.connectionId, user: this.user }));
    if (this.state === "idle") this._open();
    return ready;
  }

  /** Close for good: no reconnect; pending calls reject with `closed`. */
  close() {
    this._finalError = this._finalError || new MessageXError("closed", "the client was closed");
    this._setState("closed");
    clearTimeout(this._reconnectTimer);
    this._stopPing();
    const ws = this._ws;
    this._ws = null;
    if (ws && ws.readyState <= WebSocket.OPEN) ws.close(1000, "client closed");
    this._failPending(this._finalError);
    this._rejectWaiters(this._finalError);
    for (const sub of this._subs.values()) sub.active = false;
    this._subs.clear();
  }

  /**
   * Subscribe to a queue; `handler(message)` is called for every delivery (it may be async;
   * settle with message.ack() / message.nack()). Resolves with a Subscription once the
   * broker has answered SUBSCRIBED; rejects with the broker's error (not_found, forbidden…).
   */
  async subscribe(queue, { prefetch = 1 } = {}, handler) {
    if (typeof handler !== "function") throw new TypeError("subscribe needs a handler function");
    if (this._subs.has(queue)) {
      throw new MessageXError("already_subscribed", `already subscribed to ${queue}`);
    }
    const sub = new Subscription(this, queue, prefetch, handler);
    this._subs.set(queue, sub);
    try {
      for (;;) {
        await this._waitOpen();
        try {
          await this._sendSubscribe(sub);
          return sub;
        } catch (e) {
          if (!(e instanceof MessageXError) || e.code !== "connection_lost") throw e;
        }
      }
    } catch (e) {
      sub.active = false;
      if (this._subs.get(queue) === sub) this._subs.delete(queue);
      throw e;
    }
  }

  /**
   * Publish with confirm: `message` is a publish body (routing_key, body or body_base64,
   * headers, properties, delay_ms, mandatory) plus `exchange`, or `queue` for the default
   * exchange; `properties.priority` (0-255) orders claims in a queue with x-max-priority.
   * Resolves with {routed, queues, message_id, rejected, duplicates} once the broker has
   * committed it: `rejected` lists the matched queues that refused their copy (full, with
   * x-overflow reject-publish or reject-publish-dlx); `duplicates` lists those that already
   * had this `properties.message_id` within their x-deduplication-window-seconds (or earlier in
   * the batch) and stored nothing — send your own message_id and a retry is safe (§15).
   * `properties.expiration` (a string of decimal digits, ms) is the message's time to live in
   * each queue it reaches; the queue's `x-message-ttl` wins when smaller.
   * `properties.group_id` (1-128 characters): in a queue with x-message-groups, copies of one
   * group are delivered one at a time, in order (contract §16).
   */
  async publish(message) {
    await this._waitOpen();
    const reply = await this._request({ ...message, type: "PUBLISH" });
    return {
      routed: reply.routed,
      queues: reply.queues,
      message_id: reply.message_id,
      rejected: reply.rejected || [],
      duplicates: reply.duplicates || [],
    };
  }

  // -- exchanges and bindings (REST, same broker and credentials; contract §4, §6, §14) --

  /**
   * Declare an exchange. `alternateExchange` names an existing exchange that gets the
   * messages this one routes to no queue (`arguments["alternate-exchange"]`).
   * @param {string} name
   * @param {{type: "direct"|"fanout"|"topic"|"headers", durable?: boolean,
   *          auto_delete?: boolean, alternateExchange?: string, arguments?: object}} options
   */
  declareExchange(name, { type, durable = true, auto_delete = false, alternateExchange, arguments: args = {} }) {
    const body = { type, durable, auto_delete, arguments: { ...args } };
    if (alternateExchange !== undefined) body.arguments["alternate-exchange"] = alternateExchange;
    return this._rest("PUT", `/exchanges/${encodeURIComponent(name)}`, body);
  }

  /**
   * Declare a queue (contract §5, §13). The §13 arguments may be given by name —
   * messageTtl (x-message-ttl, ms), expires (x-expires, ms), maxLength (x-max-length),
   * maxLengthBytes (x-max-length-bytes), overflow (x-overflow), maxPriority (x-max-priority),
   * singleActiveConsumer (x-single-active-consumer), messageGroups (x-message-groups: one
   * copy of a group in flight at a time, contract §16), deadLetterExchange
   * (x-dead-letter-exchange), deadLetterRoutingKey (x-dead-letter-routing-key),
   * deduplicationWindowSeconds (x-deduplication-window-seconds, 1-86400, contract §15) — or in
   * `arguments` under their RabbitMQ names. Resolves with the queue and its stats.
   */
  declareQueue(name, options = {}) {
    const {
      durable = true, max_delivery_count = null, dead_letter_queue = null,
      ack_timeout_seconds = null, arguments: args = {},
    } = options;
    const body = { durable, max_delivery_count, dead_letter_queue, ack_timeout_seconds, arguments: { ...args } };
    for (const [option, key] of QUEUE_ARGUMENTS) {
      if (options[option] !== undefined) body.arguments[key] = options[option];
    }
    return this._rest("PUT", `/queues/${encodeURIComponent(name)}`, body);
  }

  /** Delete a queue (optionally only if it is empty / unused). */
  deleteQueue(name, { ifEmpty = false, ifUnused = false } = {}) {
    const query = new URLSearchParams();
    if (ifEmpty) query.set("if_empty", "true");
    if (ifUnused) query.set("if_unused", "true");
    const suffix = query.size ? `?${query}` : "";
    return this._rest("DELETE", `/queues/${encodeURIComponent(name)}${suffix}`);
  }

  /** Delete an exchange and the bindings it is source or destination of. */
  deleteExchange(name, { ifUnused = false } = {}) {
    return this._rest("DELETE", `/exchanges/${encodeURIComponent(name)}${ifUnused ? "?if_unused=true" : ""}`);
  }

  /**
   * Bind a queue, or another exchange (`destination_exchange`), to `exchange`: exactly one
   * of `queue` and `destination_exchange`. Resolves with the binding
   * {id, exchange, queue, destination_exchange, routing_key, arguments}.
   */
  bind({ exchange, queue, destination_exchange, routing_key = "", arguments: args = {} }) {
    if ((queue === undefined) === (destination_exchange === undefined)) {
      return Promise.reject(new TypeError("give exactly one of queue and destination_exchange"));
    }
    const body = { exchange, routing_key, arguments: args };
    if (queue !== undefined) body.queue = queue;
    else body.destination_exchange = destination_exchange;
    return this._rest("POST", "/bindings", body);
  }

  /** Delete a binding by its id. */
  unbind(id) {
    return this._rest("DELETE", `/bindings/${encodeURIComponent(id)}`);
  }

  /** The first 1000 bindings matching {exchange, queue, destination_exchange}, by id. */
  async bindings(filter = {}) {
    const query = new URLSearchParams({ limit: "1000" });
    for (const key of ["exchange", "queue", "destination_exchange"]) {
      if (filter[key] !== undefined) query.set(key, filter[key]);
    }
    return (await this._rest("GET", `/bindings?${query}`)).items;
  }

  // -- messages by filter (REST; contract §17) ------------------------------------------
  // A filter: {status: ["ready","delayed","dead"], routing_key: "order.#", headers: {...},
  // message_ids: [...], published_after, published_before (RFC 3339), min_delivery_count,
  // death_reason: "rejected"|"expired"|"maxlen"|"delivery_limit"}; {} matches every copy.

  /** One page of a queue's copies matching `filter`: {items, next_after} (browse items). */
  queryMessages(queue, filter = {}, { limit = 100, after } = {}) {
    const body = { filter, limit };
    if (after !== undefined && after !== null) body.after = after;
    return this._rest("POST", `/queues/${encodeURIComponent(queue)}/messages/query`, body);
  }

  /**
   * Move up to `limit` matching copies to queue `to`; `to: null` redrives each back to the
   * queue its newest x-death entry names. Resolves with {matched, moved, skipped}.
   */
  moveMessages(queue, filter = {}, { to, limit = 1000, dryRun = false } = {}) {
    if (to === undefined) return Promise.reject(new TypeError("give `to`: a queue, or null to redrive"));
    const body = { filter, to, limit, dry_run: dryRun };
    return this._rest("POST", `/queues/${encodeURIComponent(queue)}/messages/move`, body);
  }

  /** Delete up to `limit` matching copies (never in flight): {matched, deleted}. */
  deleteMessages(queue, filter = {}, { limit = 1000, dryRun = false } = {}) {
    const body = { filter, limit, dry_run: dryRun };
    return this._rest("POST", `/queues/${encodeURIComponent(queue)}/messages/delete`, body);
  }

  // -- diagnosis (contract §19) and connections (§20) ----------------------------------

  /** Why is this queue stuck? {queue, checked_at, head, oldest_in_flight, consumers, findings}. */
  diagnoseQueue(name) {
    return this._rest("GET", `/queues/${encodeURIComponent(name)}/diagnosis`);
  }

  /** The database's side (admin): bloat, xmin holders, broker processes, findings. */
  diagnoseDatabase() {
    return this._rest("GET", "/diagnosis");
  }

  /** Every WebSocket connection on every broker process (admin), by connection id: one page;
   * `contains`: only those whose username contains it (contract §20). */
  async connections({ limit = 100, after, contains } = {}) {
    const query = new URLSearchParams({ limit: String(limit) });
    if (after !== undefined && after !== null) query.set("after", after);
    if (contains) query.set("contains", contains);
    return this._rest("GET", `/connections?${query}`);
  }

  /** Close a WebSocket connection wherever it is (admin): 1008 within 5 s. */
  closeConnection(connectionId) {
    return this._rest("DELETE", `/connections/${encodeURIComponent(connectionId)}`);
  }

  // -- lists by name (REST; contract §1, §20) --------------------------------------------

  /** Every exchange you have some permission on, by name; `contains`: only the names that
   * contain this text (case-sensitive). */
  exchanges({ contains } = {}) {
    return this._listAll("/exchanges", contains);
  }

  /** Every queue you have some permission on (with its stats), by name; `contains` as above. */
  queues({ contains } = {}) {
    return this._listAll("/queues", contains);
  }

  /** Every user, by name (admin only); `contains` as above. */
  users({ contains } = {}) {
    return this._listAll("/users", contains);
  }

  /** All pages of a list by name (`?limit=1000&after=`), filtered by `?contains=` if given. */
  async _listAll(path, contains) {
    const items = [];
    let after = null;
    for (;;) {
      const query = new URLSearchParams({ limit: "1000" });
      if (contains) query.set("contains", contains);
      if (after !== null) query.set("after", after);
      const page = await this._rest("GET", `${path}?${query}`);
      items.push(...page.items);
      after = page.next_after;
      if (after === null || after === undefined) return items;
    }
  }

  // -- history (REST; the UI's charts, an addition beyond contract §20) -------------------
  // Resolve with {interval_seconds, samples: [{at, published, delivered, acked, ready,
  // delayed, in_flight, dead}]}: the last 10 minutes, oldest first; rates are counts per
  // interval summed over every broker process, depths null where not sampled.

  /** Broker-wide message rates and depths (admin). */
  overviewHistory() {
    return this._rest("GET", "/overview/history");
  }

  /** One queue's message rates and depths. */
  queueHistory(name) {
    return this._rest("GET", `/queues/${encodeURIComponent(name)}/history`);
  }

  async _rest(method, path, body) {
    const url = new URL(this.url);
    url.protocol = url.protocol === "wss:" ? "https:" : "http:";
    const root = url.pathname.replace(/\/ws$/, "");
    const headers = { Accept: "application/json", Authorization: restAuthorization(this._auth) };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(`${url.origin}${root}${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    const data = text ? JSON.parse(text) : null;
    if (!response.ok) {
      throw new MessageXError(data?.code || `http_${response.status}`, data?.detail || response.statusText, data);
    }
    return data;
  }

  /** Round trip to the broker. */
  async ping() {
    await this._waitOpen();
    await this._request({ type: "PING" });
  }

  // -- internals -----------------------------------------------------------------------

  _setState(state, detail = {}) {
    if (this.state === "closed" && state !== "closed") return;
    this.state = state;
    this.dispatchEvent(new CustomEvent("state", { detail: { state, ...detail } }));
  }

  _emitError(error) {
    this.dispatchEvent(new CustomEvent("error", { detail: { error } }));
  }

  _closedError() {
    return this._finalError || new MessageXError("closed", "the client was closed");
  }

  _waitOpen() {
    if (this.state === "open") return Promise.resolve(this._generation);
    if (this.state === "closed") return Promise.reject(this._closedError());
    return new Promise((resolve, reject) => this._openWaiters.push({ resolve, reject }));
  }

  _resolveWaiters() {
    const waiters = this._openWaiters.splice(0);
    for (const w of waiters) w.resolve(this._generation);
  }

  _rejectWaiters(error) {
    const waiters = this._openWaiters.splice(0);
    for (const w of waiters) w.reject(error);
  }

  _open() {
    this._setState(this._attempt === 0 && this._generation === 0 ? "connecting" : "reconnecting");
    this._generation += 1;
    const generation = this._generation;
    let ws;
    try {
      ws = new WebSocket(this.url);
    } catch (e) {
      this._finalError = new MessageXError("bad_url", e.message);
      this.close();
      return;
    }
    this._ws = ws;
    ws.onopen = () => this._authenticate(ws, generation);
    ws.onmessage = (event) => this._onFrame(ws, generation, event.data);
    ws.onclose = (event) => this._onClose(ws, event);
  }

  async _authenticate(ws, generation) {
    try {
      const connected = await this._request({ type: "AUTH", ...this._auth }, ws);
      this.user = connected.user;
      this.connectionId = connected.connection_id;
      // Resubscribe what was confirmed before; new subscriptions wait for "open" and send
      // their own SUBSCRIBE.
      for (const sub of [...this._subs.values()]) {
        if (!sub.confirmed || !sub.active) continue;
        try {
          await this._sendSubscribe(sub, ws);
        } catch (e) {
          if (e.code === "connection_lost") return;
          this._dropSubscription(sub, e.code);
        }
      }
      if (generation !== this._generation || this._ws !== ws) return;
      this._attempt = 0;
      this._setState("open");
      this._startPing(ws);
      this.dispatchEvent(new CustomEvent("connected", { detail: connected }));
      this._resolveWaiters();
    } catch {
      // An AUTH refusal is followed by a close (4401: final; 4429 or 1013: try again later);
      // _onClose decides what follows.
    }
  }

  async _sendSubscribe(sub, ws) {
    await this._request({ type: "SUBSCRIBE", queue: sub.queue, prefetch: sub.prefetch }, ws);
    sub.confirmed = true;
  }

  _dropSubscription(sub, reason) {
    sub.active = false;
    if (this._subs.get(sub.queue) === sub) this._subs.delete(sub.queue);
    this.dispatchEvent(new CustomEvent("cancelled", { detail: { queue: sub.queue, reason } }));
  }

  _request(frame, ws = this._ws) {
    if (!ws || ws.readyState !== WebSocket.OPEN) {
      return Promise.reject(new MessageXError("connection_lost", "not connected"));
    }
    const id = this._nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending.delete(id);
        reject(new MessageXError("timeout", `no reply to ${frame.type} in time`));
      }, this.requestTimeoutMs);
      this._pending.set(id, { resolve, reject, timer, ws });
      ws.send(JSON.stringify({ ...frame, id }));
    });
  }

  _onFrame(ws, generation, data) {
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      return;
    }
    if (frame.type === "SUBSCRIBED" || frame.type === "SUBSCRIPTION_ACTIVE") {
      // here, in frame order: a SUBSCRIPTION_ACTIVE may follow SUBSCRIBED at once
      const sub = this._subs.get(frame.queue);
      if (sub) sub.waiting = frame.active === false;
      if (sub && frame.type === "SUBSCRIPTION_ACTIVE") {
        this.dispatchEvent(new CustomEvent("activated", { detail: { queue: frame.queue } }));
      }
    }
    const waiter = frame.id !== undefined ? this._pending.get(frame.id) : undefined;
    if (waiter) {
      this._pending.delete(frame.id);
      clearTimeout(waiter.timer);
      if (frame.type === "ERROR") waiter.reject(new MessageXError(frame.code, frame.message, frame));
      else waiter.resolve(frame);
      return;
    }
    switch (frame.type) {
      case "MESSAGE_DELIVERED":
        this._deliver(ws, generation, frame);
        break;
      case "SUBSCRIPTION_CANCELLED": {
        const sub = this._subs.get(frame.queue);
        if (sub) this._dropSubscription(sub, frame.reason);
        break;
      }
      case "ERROR":
        this._emitError(new MessageXError(frame.code, frame.message, frame));
        break;
      default:
        break;
    }
  }

  _deliver(ws, generation, frame) {
    const sub = this._subs.get(frame.queue);
    if (!sub) {
      // Nobody wants it any more: hand it back at once rather than hold it until a timeout.
      ws.send(JSON.stringify({ type: "NACK", delivery_tag: frame.delivery_tag, requeue: true }));
      return;
    }
    const message = new Message(this, generation, frame);
    try {
      const result = sub.handler(message);
      if (result && typeof result.catch === "function") result.catch((e) => this._emitError(e));
    } catch (e) {
      this._emitError(e);
    }
  }

  _failPending(error, ws) {
    for (const [id, waiter] of this._pending) {
      if (ws && waiter.ws !== ws) continue;
      clearTimeout(waiter.timer);
      this._pending.delete(id);
      waiter.reject(error);
    }
  }

  _onClose(ws, event) {
    if (ws !== this._ws) {
      this._failPending(new MessageXError("connection_lost", "the connection closed"), ws);
      return;
    }
    this._ws = null;
    this._stopPing();
    this._failPending(new MessageXError("connection_lost", "the connection closed"), ws);
    if (this.state === "closed") return;
    if (event.code === CLOSE_UNAUTHORIZED) {
      this._finalError = new MessageXError("unauthorized", event.reason || "authentication failed");
      this._emitError(this._finalError);
      this.close();
      return;
    }
    const ceiling = Math.min(this.maxBackoffMs, this.minBackoffMs * 2 ** this._attempt);
    const delayMs = Math.round(ceiling / 2 + (Math.random() * ceiling) / 2);
    this._attempt += 1;
    this._setState("reconnecting", { attempt: this._attempt, delayMs, code: event.code });
    this._reconnectTimer = setTimeout(() => {
      if (this.state !== "closed") this._open();
    }, delayMs);
  }

  _startPing(ws) {
    this._stopPing();
    if (!this.pingIntervalMs) return;
    this._pingTimer = setInterval(() => {
      if (ws !== this._ws) return;
      this._request({ type: "PING" }, ws).catch((e) => {
        // No PONG in time: the connection is dead without knowing it. Start over.
        if (e.code === "timeout" && ws === this._ws) ws.close(4000, "ping timeout");
      });
    }, this.pingIntervalMs);
  }

  _stopPing() {
    clearInterval(this._pingTimer);
    this._pingTimer = null;
  }
}

/** Create a client and connect it; resolves with the connected client. */
export async function connect(options = {}) {
  const client = new Client(options);
  await client.connect();
  return client;
}
