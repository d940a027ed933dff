// One request: its summary, the flame chart of its lanes, and a table of its functions.
import { AWAIT_COLOUR, FlameChart, READY_COLOUR } from "./timeline.js";
import { el, exportLinks, formatMs, formatNs, getJSON, table, ui } from "./common.js";

// Per function over the request: calls, wall (outermost calls only, so recursion counts
// once), self, active, await, ready. A summary's merged node counts all its calls.
function functionTotals(lanes) {
  const totals = new Map();
  const open = new Map();
  for (const lane of lanes) {
    const todo = lane.root.children.map((node) => [node, false]);
    while (todo.length) {
      const [node, leaving] = todo.pop();
      const name = node.function;
      if (leaving) {
        open.set(name, open.get(name) - 1);
        continue;
      }
      let row = totals.get(name);
      if (!row) {
        row = { function: name, calls: 0, wall: 0, self: 0, active: 0, await: 0, ready: 0 };
        totals.set(name, row);
      }
      row.calls += node.calls ?? 1;
      row.self += node.self_ns;
      row.active += node.active_ns;
      row.await += node.await_ns;
      row.ready += node.ready_ns;
      if (!open.get(name)) row.wall += node.wall_ns ?? node.end_ns - node.start_ns;
      open.set(name, (open.get(name) || 0) + 1);
      todo.push([node, true]);
      for (const child of node.children) todo.push([child, false]);
    }
  }
  return [...totals.values()];
}

function legend() {
  const swatch = (style, text) => el("span", { class: "swatch" }, el("i", { style }), text);
  return el(
    "div",
    { class: "legend" },
    swatch("background:#f4a261", "running call"),
    swatch("background:repeating-linear-gradient(135deg,#fbe3cf 0 3px,#c9b8a8 3px 4px)",
      "suspended, awaiting"),
    swatch(`background:${READY_COLOUR}`, "ready, waiting for the event loop"),
    swatch(`background:${AWAIT_COLOUR}`, "foot strip (waits not kept): active | await | ready"),
    swatch("background:#333;clip-path:polygon(0 0,100% 0,50% 100%)", "lane spawned here"),
    el("span", { class: "hint" }, "wheel: zoom · drag: pan · double-click: zoom to call"),
  );
}

function statusBadge(status) {
  const failed = status === null || status === undefined || status >= 500;
  const text = status ?? "unknown (no response)";
  const title = failed ? "server error or no response" : status >= 400 ? "refused" : "ok";
  const cls = failed || status >= 400 ? "status-error" : "status-ok";
  return el("span", { id: "request-status", class: cls, title }, `${text}`);
}

// The exception that left the request's code: the outermost call of the main lane that
// ended by an exception, and the innermost call it came from (down the chain of calls
// that also ended by one).
function escapedException(lanes) {
  const main = lanes.find((lane) => lane.kind === "main");
  const top = main?.root.children.find((node) => node.outcome === "exception");
  if (!top) return null;
  let origin = top;
  for (;;) {
    const next = origin.children.findLast((node) => node.outcome === "exception");
    if (!next) return { top, origin };
    origin = next;
  }
}

function exceptionLine(lanes) {
  const found = escapedException(lanes);
  if (!found) return ""; // nothing shown (replaceChildren would print null)
  const { top, origin } = found;
  const where = origin === top ? "" : `, raised in ${origin.function}`;
  const text = `Exception: ${top.function} ended by an exception${where}`;
  return el("p", { id: "request-exception", class: "exception" }, text);
}

// `qualname` over a grey `module`, so the side table stays narrow.
function nameCell(name) {
  const cut = name.indexOf(":");
  const module = el("small", {}, name.slice(0, cut));
  return el("span", { title: name }, name.slice(cut + 1), el("br"), module);
}

// A summary says so: what it merged, and how to see the calls it left out.
function summarisedLine(body) {
  if (!body.summarised) return "";
  const text =
    `Summarised: ${body.calls.toLocaleString()} calls are too many to draw one by one, ` +
    "so calls on the same call path are merged (×count) and the lightest paths left out " +
    "(▸: double-click to expand).";
  return el("p", { id: "request-summarised", class: "warn" }, text);
}

export async function requestView(root, id) {
  const path = `/api/requests/${encodeURIComponent(id)}`;
  const body = await getJSON(path);
  const sources = new Map(body.functions.map((f) => [f.function, `${f.file}:${f.line}`]));
  const chartBox = el("div", { class: "chart-box" });
  let chart = null;
  const rows = functionTotals(body.lanes).map((row) => ({
    ...row,
    source: sources.get(row.function) || "",
  }));
  // A node's summary below it replaces its children (which it had none of: left out).
  const expand = async (node) => {
    const below = await getJSON(path, { node: node.id });
    node.children = below.node.children;
    node.hidden = 0;
    chart.relayout();
    chart.redraw();
  };
  const select = (name) => {
    chart.highlight = chart.highlight === name ? null : name;
    for (const tr of tableBox.querySelectorAll("tr[data-function]")) {
      tr.classList.toggle("selected", tr.dataset.function === chart.highlight);
    }
    chart.redraw();
  };
  const ns = (v) => formatNs(v);
  const functions = table(
    [
      ["function", "function", nameCell],
      ["calls", "calls"],
      ["wall", "wall", ns],
      ["self", "self", ns],
      ["active", "active", ns],
      ["await", "await", ns],
      ["ready", "ready", ns],
      ["file:line", "source", (v) => el("span", { title: v }, v.slice(v.lastIndexOf("/") + 1))],
    ],
    rows,
    {
      sortKey: "self",
      maxRows: 500,
      onRow: (row) => select(row.function),
      rowAttrs: (row) => ({
        "data-function": row.function,
        class: row.function === chart?.highlight ? "selected" : null,
      }),
    },
  );
  const title = el("h3", {}, "Functions of this request");
  const tableBox = el("div", { class: "side" }, title, functions);
  const zoom = (factor) => {
    const mid = (chart.t0 + chart.t1) / 2;
    const half = ((chart.t1 - chart.t0) * factor) / 2;
    chart.zoomTo(mid - half, mid + half);
  };
  root.replaceChildren(
    el(
      "div",
      { class: "summary" },
      el("h2", {}, `${body.method} ${body.route}`),
      el("span", {}, `${body.service} · status `),
      statusBadge(body.status),
      el("span", {}, ` · ${formatMs(body.duration_ms)}`),
      el("span", {}, ` · ${body.calls} calls · ${body.lanes.length} lanes · ${body.start}`),
      body.truncated ? el("span", { class: "warn" }, " · truncated") : null,
    ),
    exceptionLine(body.lanes),
    summarisedLine(body),
    el(
      "div",
      { class: "toolbar" },
      el("button", { id: "zoom-in", onclick: () => zoom(0.5) }, "Zoom in"),
      el("button", { id: "zoom-out", onclick: () => zoom(2) }, "Zoom out"),
      el("button", { id: "zoom-reset", onclick: () => chart.zoomTo(0, chart.end) }, "Reset"),
      exportLinks(`/api/requests/${encodeURIComponent(body.id)}/export`, {}, [
        ["speedscope", "speedscope"],
        ["chrome", "Chrome trace (Perfetto)"],
        ["folded", "folded stacks"],
      ]),
      legend(),
    ),
    el("div", { class: "split" }, chartBox, tableBox),
  );
  chart = new FlameChart(chartBox, body.lanes, sources, select, expand);
  chart.draw();
  ui.loaded = { ...ui.loaded, timeline: performance.now() };
  return () => chart.redraw();
}
