// DOM helpers. Every piece of data becomes a Text node or an attribute value set through
// the DOM API: nothing here ever parses a string as HTML, so names, headers and message
// bodies render as the text they are, whatever they hold.

/**
 * Create an element. `props` keys: `class`, `dataset` (object), `on<Event>` (functions
 * only), boolean properties (`disabled`, `checked`, `hidden`, `required`, `selected`,
 * `multiple`, `open`), `value`; anything else becomes an attribute via setAttribute.
 * Children: strings and numbers become Text nodes; null, undefined and false are skipped;
 * arrays are flattened.
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") {
      el.className = value;
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (key.startsWith("on") && key.length > 2) {
      if (typeof value !== "function") throw new TypeError(`${key} must be a function`);
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (BOOLEAN_PROPS.has(key)) {
      el[key] = Boolean(value);
    } else if (key === "value") {
      el.value = String(value);
    } else if (key === "href") {
      el.setAttribute("href", safeHref(value));
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

const BOOLEAN_PROPS = new Set([
  "disabled", "checked", "hidden", "required", "selected", "multiple", "open", "readOnly",
]);

/** Only in-page links: a hash route, or a path on this origin. */
function safeHref(value) {
  const s = String(value);
  if (s.startsWith("#") || (s.startsWith("/") && !s.startsWith("//"))) return s;
  throw new TypeError("links must stay on this page");
}

export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

export function clear(node) {
  node.replaceChildren();
  return node;
}

/** Replace `node`'s children. */
export function fill(node, ...children) {
  clear(node);
  return append(node, children);
}

/** A hash route link to a page of this UI; `parts` are encoded, so names stay names. */
export function route(...parts) {
  return "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/");
}

export function link(text, ...parts) {
  return h("a", { href: route(...parts) }, text);
}

/** Pretty JSON for display (as text, in a <pre>). */
export function json(value) {
  if (value === undefined) return "";
  return JSON.stringify(value, null, 2);
}

let uid = 0;
export function nextId(prefix) {
  uid += 1;
  return `${prefix}-${uid}`;
}

/** A labelled form field. `control` is an input/select/textarea element. */
export function field(labelText, control, hint) {
  if (!control.id) control.id = nextId("f");
  const parts = [h("label", { for: control.id }, labelText), control];
  if (hint) {
    const hintEl = h("small", { id: nextId("hint"), class: "hint" }, hint);
    const described = control.getAttribute("aria-describedby");
    control.setAttribute("aria-describedby", described ? `${described} ${hintEl.id}` : hintEl.id);
    parts.push(hintEl);
  }
  return h("div", { class: "field" }, parts);
}

/** A labelled checkbox (label after the box). */
export function checkbox(labelText, props = {}) {
  const input = h("input", { type: "checkbox", id: nextId("c"), ...props });
  return { input, el: h("div", { class: "field check" }, input, h("label", { for: input.id }, labelText)) };
}

/** A definition list from [term, value] pairs. */
export function dl(pairs, props = {}) {
  return h("dl", props, pairs.map(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
}

/** A table with a caption, a header row and rows of cells (each a node or text). */
export function table(caption, headers, rows, props = {}) {
  return h(
    "table",
    props,
    h("caption", null, caption),
    h("thead", null, h("tr", null, headers.map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", null, rows.map((cells) => h("tr", null, cells.map((c) => h("td", null, c))))),
  );
}

export function formatTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

/** Parse a JSON text field: {ok, value} or {ok: false, error}. Empty means `fallback`. */
export function parseJsonField(text, fallback) {
  if (text.trim() === "") return { ok: true, value: fallback };
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch (e) {
    return { ok: false, error: e.message };
  }
}

/**
 * A filter box for a list page: `?contains=` (contract §20), a case-sensitive part of the
 * name. `onChange` runs (debounced) when the text changes; the caller goes back to the first
 * page and reloads with `filter.value` as the query's `contains`.
 */
export function filterBox(label, onChange) {
  const input = h("input", { type: "search", name: "contains", autocomplete: "off", spellcheck: "false" });
  let timer = null;
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(onChange, 250);
  });
  return {
    el: h("div", { class: "filter" }, field(label, input, "Case-sensitive; part of the name")),
    get value() {
      return input.value;
    },
  };
}
