// Charts of the last 10 minutes: message rates (published, delivered, acked per second) and
// depth by status (ready, delayed, in flight, dead), drawn as inline SVG from
// GET /overview/history or GET /queues/{name}/history. No library, no external asset;
// every value reaches the page through setAttribute or a Text node.

import { api } from "./api.js";
import { h, fill, nextId } from "./dom.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const WIDTH = 600;
const HEIGHT = 170;
const PAD = { left: 48, right: 8, top: 10, bottom: 22 };

export const RATE_SERIES = [
  ["published", "Published"],
  ["delivered", "Delivered"],
  ["acked", "Acked"],
];
export const DEPTH_SERIES = [
  ["ready", "Ready"],
  ["delayed", "Delayed"],
  ["in_flight", "In flight"],
  ["dead", "Dead"],
];

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** The smallest 1, 2 or 5 times a power of ten at or above `value` (at least 1). */
export function niceMax(value) {
  if (!(value > 1)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

function formatNumber(value) {
  if (value === null || value === undefined) return "—";
  if (Number.isInteger(value)) return value.toLocaleString("en");
  return value < 10 ? value.toFixed(2) : value.toFixed(1);
}

/**
 * An SVG line chart of `series` ([key, label]) over `samples`; values from `valueOf`. Each
 * series' path carries its latest value (data-last) and, for rates, the sum of the counts
 * of the window (data-count).
 */
function lineChart(title, samples, series, valueOf, unit, counted = false) {
  const n = samples.length;
  const plotW = WIDTH - PAD.left - PAD.right;
  const plotH = HEIGHT - PAD.top - PAD.bottom;
  let top = 0;
  for (const s of samples) for (const [key] of series) {
    const v = valueOf(s, key);
    if (v !== null && v > top) top = v;
  }
  const max = niceMax(top);
  const x = (i) => PAD.left + (n <= 1 ? 0 : (i * plotW) / (n - 1));
  const y = (v) => PAD.top + plotH - (v / max) * plotH;

  const grid = [0, max / 2, max].map((v) => [
    svg("line", { class: "grid", x1: PAD.left, x2: WIDTH - PAD.right, y1: y(v), y2: y(v) }),
    svg("text", { class: "axis", x: PAD.left - 6, y: y(v) + 4, "text-anchor": "end" }, formatNumber(v)),
  ]);
  const minutes = n > 1 ? Math.round(((Date.parse(samples[n - 1].at) - Date.parse(samples[0].at)) / 60000)) : 0;
  const xLabels = [
    svg("text", { class: "axis", x: PAD.left, y: HEIGHT - 6, "text-anchor": "start" }, `−${minutes} min`),
    svg("text", { class: "axis", x: WIDTH - PAD.right, y: HEIGHT - 6, "text-anchor": "end" }, "now"),
  ];
  const lines = series.map(([key, label]) => {
    let d = "";
    let pen = false;
    let count = 0;
    let last = null;
    samples.forEach((s, i) => {
      const v = valueOf(s, key);
      if (v === null) {
        pen = false;
        return;
      }
      if (counted) count += s[key];
      last = v;
      d += `${pen ? "L" : "M"}${x(i).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    });
    return svg("path", {
      class: `series series-${key}`,
      d: d || "M0,0",
      fill: "none",
      "data-series": key,
      "data-last": last === null ? "" : last,
      "data-count": counted ? count : "",
      "data-label": label,
    });
  });
  const latest = Object.fromEntries(series.map(([key]) => {
    for (let i = n - 1; i >= 0; i -= 1) {
      const v = valueOf(samples[i], key);
      if (v !== null) return [key, v];
    }
    return [key, null];
  }));
  const summary = series.map(([key, label]) => `${label} ${formatNumber(latest[key])}${unit}`).join(", ");
  const titleId = nextId("chart");
  const chart = svg(
    "svg",
    {
      viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
      class: "chart",
      role: "img",
      "aria-labelledby": titleId,
    },
    svg("title", { id: titleId }, `${title}, last ${minutes} minutes; now: ${summary}`),
    grid,
    xLabels,
    lines,
  );
  const legend = h(
    "ul",
    { class: "legend" },
    series.map(([key, label]) => h(
      "li",
      { dataset: { series: key } },
      h("span", { class: `swatch series-${key}`, "aria-hidden": "true" }),
      `${label} `,
      h("strong", null, `${formatNumber(latest[key])}${unit}`),
    )),
  );
  return h("figure", { class: "chart-figure" }, h("figcaption", null, title), chart, legend);
}

/**
 * Charts of `path` (a history endpoint). Returns {el, refresh}: refresh() reads the history
 * at most once per sample interval (the page refreshes more often) and redraws.
 */
export function historyCharts(path, ctx) {
  const el = h("div", { class: "charts", dataset: { charts: path } }, h("p", { class: "hint" }, "Loading charts…"));
  let readAt = 0;
  let interval = 5;
  let stopped = false;
  async function refresh(force = false) {
    if (stopped) return;
    const now = Date.now();
    if (!force && now - readAt < interval * 1000) return;
    readAt = now;
    try {
      const history = await api("GET", path);
      interval = history.interval_seconds;
      const step = history.interval_seconds;
      const samples = history.samples;
      fill(
        el,
        h("div", { class: "chart-row" },
          lineChart("Message rates (per second)", samples, RATE_SERIES, (s, key) => s[key] / step, "/s", true),
          lineChart("Queue depth (messages)", samples, DEPTH_SERIES, (s, key) => s[key], ""),
        ),
        h("p", { class: "hint" }, `Every ${step} s, summed over every broker process.`),
      );
    } catch (error) {
      fill(el, h("p", { class: "hint" }, "Charts unavailable."));
      // 403/404: the page shows the same error; the charts stop asking
      if ([403, 404].includes(error.status)) stopped = true;
      else ctx.showError(error, "Charts");
    }
  }
  return { el, refresh };
}
