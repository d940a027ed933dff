// Aggregates over a service/route/time range: the flame graph and the top functions.
import { colourFor, el, exportLinks, formatNs, getJSON, table, ui } from "./common.js";
import { filterForm } from "./form.js";
import { Icicle, buildTree, icicleToolbar } from "./icicle.js";

export const RANGE_FIELDS = [
  ["service", "service", "text"],
  ["route", "route", "text"],
];

const FIELDS = [...RANGE_FIELDS, ["since", "since", "time"], ["until", "until", "time"]];
const percent = (part, whole) => `${((100 * part) / Math.max(1, whole)).toFixed(1)}%`;

export async function flameView(root, params) {
  const { service, route, since, until } = params;
  const range = { service, route, since, until };
  const [graph, totals] = await Promise.all([
    getJSON("/api/flamegraph", { ...range, format: "json" }),
    getJSON("/api/functions", range),
  ]);
  const sources = new Map(totals.functions.map((f) => [f.function, `${f.file}:${f.line}`]));
  const started = performance.now();
  const tree = buildTree([graph.stacks]);
  ui.layouts = { ...ui.layouts, flame: performance.now() - started };
  const chartBox = el("div", { class: "chart-box" });
  const ns = (v) => formatNs(v);
  const icicle = new Icicle(chartBox, tree, {
    name: "flame",
    value: (n) => n.total[0],
    colour: (n) => colourFor(n.name),
    describe: (n) => [
      ["", n.name],
      ["at", sources.get(n.name) || "—"],
      ["total", `${formatNs(n.total[0])} (${percent(n.total[0], tree.total[0])})`],
      ["self", formatNs(n.self[0])],
      ["calls", `${n.calls[0]}`],
    ],
  });
  root.replaceChildren(
    filterForm("flame", FIELDS, params),
    el(
      "p",
      { class: "hint" },
      `${graph.stacks.length} stacks, ${formatNs(tree.total[0])} · `,
      exportLinks("/api/flamegraph", range, [
        ["folded", "folded stacks"],
        ["speedscope", "speedscope"],
        ["pprof", "pprof"],
      ]),
    ),
    icicleToolbar(icicle),
    chartBox,
    el("h3", {}, "Top functions"),
    table(
      [
        ["function", "function"],
        ["calls", "calls"],
        ["total", "total_ns", ns],
        ["self", "self_ns", ns],
        ["active", "active_ns", ns],
        ["await", "await_ns", ns],
        ["ready", "ready_ns", ns],
        ["max", "max_ns", ns],
        ["file:line", "line", (line, row) => `${row.file}:${line}`],
      ],
      totals.functions.slice(0, 200),
      { sortKey: "self_ns" },
    ),
  );
  icicle.draw();
  ui.loaded = { ...ui.loaded, flame: performance.now() };
  return () => icicle.draw();
}
