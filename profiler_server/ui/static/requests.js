// The request list: filters, the slowest or newest requests, and a duration histogram of
// one route (click a bar to list the requests in it).
import { ROW, sizeCanvas, timed } from "./canvas.js";
import { el, formatMs, getJSON, hideTooltip, showTooltip, table } from "./common.js";
import { filterForm, go } from "./form.js";

const FIELDS = [
  ["service", "service", "text"],
  ["route", "route", "text"],
  ["status", "status", "text"],
  ["min_duration_ms", "min ms", "number"],
  ["max_duration_ms", "max ms", "number"],
  ["since", "since", "time"],
  ["until", "until", "time"],
  ["function", "called function", "text"],
  ["order", "sort by", "text", ["duration", "start"]],
  ["limit", "limit", "number"],
];
const BINS = 30;
const HEIGHT = 120;

function bins(durations) {
  const low = Math.log(Math.max(0.01, Math.min(...durations))) - 0.05;
  const high = Math.log(Math.max(...durations)) + 0.05;
  const step = (high - low) / BINS;
  const counts = new Array(BINS).fill(0);
  for (const d of durations) counts[Math.min(BINS - 1, Math.floor((Math.log(d) - low) / step))]++;
  return counts.map((count, i) => ({
    count,
    from: Math.exp(low + i * step),
    to: Math.exp(low + (i + 1) * step),
  }));
}

function histogram(container, durations, onPick) {
  const canvas = el("canvas", { class: "chart", "aria-label": "duration histogram" });
  container.replaceChildren(canvas);
  const bars = bins(durations);
  const most = Math.max(...bars.map((b) => b.count));
  const width = Math.max(200, container.clientWidth);
  const barWidth = width / BINS;
  timed("histogram", (drawn) => {
    const ctx = sizeCanvas(canvas, width, HEIGHT + ROW);
    bars.forEach((bar, i) => {
      const h = (HEIGHT * bar.count) / most;
      ctx.fillStyle = "#e07b39";
      ctx.fillRect(i * barWidth + 1, HEIGHT - h, barWidth - 2, h);
      drawn.push({ label: `${bar.count}`, x: i * barWidth, y: HEIGHT - h, w: barWidth, h, ...bar });
    });
    ctx.fillStyle = "#333";
    ctx.fillText(formatMs(bars[0].from), 2, HEIGHT + ROW / 2);
    const last = formatMs(bars[BINS - 1].to);
    ctx.fillText(last, width - ctx.measureText(last).width - 2, HEIGHT + ROW / 2);
  });
  const barAt = (event) => bars[Math.floor((event.offsetX / width) * BINS)];
  canvas.addEventListener("mousemove", (event) => {
    const bar = barAt(event);
    const range = bar && `${formatMs(bar.from)} – ${formatMs(bar.to)}`;
    if (bar) showTooltip(event, [["requests", `${bar.count}`], ["duration", range]]);
  });
  canvas.addEventListener("mouseleave", hideTooltip);
  canvas.addEventListener("click", (event) => {
    const bar = barAt(event);
    if (bar?.count) onPick(bar);
  });
}

async function routeHistogram(container, params, route) {
  const { service, since, until } = params;
  const query = { service, route, since, until, order: "start", limit: 1000 };
  const { requests } = await getJSON("/api/requests", query);
  if (!requests.length) return container.replaceChildren("no requests");
  histogram(container, requests.map((r) => r.duration_ms), (bar) =>
    go("requests", {
      ...params,
      route,
      min_duration_ms: Math.floor(bar.from * 1000) / 1000,
      max_duration_ms: Math.ceil(bar.to * 1000) / 1000,
    }),
  );
}

export async function requestsView(root, params) {
  const { requests } = await getJSON("/api/requests", { order: "duration", limit: 100, ...params });
  const routes = [...new Set(requests.map((r) => r.route))];
  const chosen = params.route || routes[0];
  const plot = el("div", { class: "chart-box histogram" });
  const picker = el(
    "select",
    { id: "histogram-route", onchange: () => routeHistogram(plot, params, picker.value) },
    routes.map((r) => el("option", { value: r }, r)),
  );
  picker.value = chosen;
  const rows = requests.map((r) => ({ ...r, when: new Date(r.start).toLocaleString() }));
  root.replaceChildren(
    filterForm("requests", FIELDS, params),
    el("div", { class: "toolbar" }, el("h3", {}, "Duration histogram of route "), picker),
    plot,
    el("h3", {}, `${requests.length} requests`),
    table(
      [
        ["start", "when"],
        ["service", "service"],
        ["method", "method"],
        ["route", "route"],
        ["status", "status", (v) => `${v ?? "—"}`],
        ["duration", "duration_ms", formatMs],
        ["calls", "calls"],
        ["truncated", "truncated", (v) => (v ? "yes" : "")],
      ],
      rows,
      {
        sortKey: params.order === "start" ? "start" : "duration_ms",
        onRow: (row) => go(`request/${encodeURIComponent(row.id)}`),
        rowAttrs: (row) => ({ "data-id": row.id, class: "link" }),
      },
    ),
  );
  if (chosen) await routeHistogram(plot, params, chosen);
  return () => chosen && routeHistogram(plot, params, picker.value);
}
