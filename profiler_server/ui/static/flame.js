// Aggregates over a service/route/time range: the flame graph and the top functions.
import { colourFor, el, exportLinks, formatNs, getJSON, table, ui } from "./common.js";
import { Icicle, buildTree, icicleToolbar } from "./icicle.js";
import { linkPickers, loadServices, pickerFields } from "./pickers.js";
import { filterForm, rangeBar } from "./form.js";
import { resolveRange } from "./timerange.js";

const percent = (part, whole) => `${((100 * part) / Math.max(1, whole)).toFixed(1)}%`;
const MAX_SERVICE_ROOTS = 20; // more services than this share one root
// What stacks are weighed by (the API's `value`, docs/api.md); the first is the default.
const VALUES = ["wall", "running", "awaiting", "ready", "calls"];

// The stacks of a range: with no service picked and several services in the range, each
// service's stacks under a root frame of its own (`service <name>`), fetched side by side.
export async function rangeStacks(scope, range, services, value = VALUES[0]) {
  const load = (service) =>
    getJSON("/api/flamegraph", { ...scope, service, ...range, format: "json", value });
  const shown = services.filter((s) => !scope.route || s.routes.includes(scope.route));
  const several = shown.length > 1 && shown.length <= MAX_SERVICE_ROOTS;
  if (scope.service || !several) return (await load(scope.service)).stacks;
  const graphs = await Promise.all(shown.map((s) => load(s.service)));
  return graphs.flatMap((graph, i) =>
    graph.stacks.map((s) => ({ ...s, stack: `service ${shown[i].service};${s.stack}` })),
  );
}

export async function flameView(root, params) {
  const { service, route } = params;
  const { since, until } = resolveRange(params);
  const range = { service, route, since, until };
  const value = VALUES.includes(params.value) ? params.value : VALUES[0];
  const services = await loadServices({ since, until });
  const [stacks, totals] = await Promise.all([
    rangeStacks({ service, route }, { since, until }, services, value),
    getJSON("/api/functions", range),
  ]);
  const sources = new Map(totals.functions.map((f) => [f.function, `${f.file}:${f.line}`]));
  const started = performance.now();
  const tree = buildTree([stacks]);
  ui.layouts = { ...ui.layouts, flame: performance.now() - started };
  const chartBox = el("div", { class: "chart-box" });
  const ns = (v) => formatNs(v);
  const amount = value === "calls" ? (v) => `${v} calls` : ns;
  const fields = [...pickerFields(services, params), ["value", "value", "text", VALUES]];
  const form = filterForm("flame", fields, params);
  linkPickers(form, services);
  const icicle = new Icicle(chartBox, tree, {
    name: "flame",
    value: (n) => n.total[0],
    colour: (n) => colourFor(n.name),
    describe: (n) => [
      ["", n.name],
      ["at", sources.get(n.name) || "—"],
      [value, `${amount(n.total[0])} (${percent(n.total[0], tree.total[0])})`],
      [`self ${value}`, amount(n.self[0])],
      ["calls", `${n.calls[0]}`],
    ],
  });
  root.replaceChildren(
    rangeBar("flame", params),
    form,
    el(
      "p",
      { class: "hint" },
      `${stacks.length} stacks, ${amount(tree.total[0])} ${value} · `,
      exportLinks("/api/flamegraph", { ...range, value }, [
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
