// Two time ranges compared (what got slower after a deploy): both flame graphs fetched and
// diffed here. Frames are sized by the later range; red = a larger share of its range's
// time than before, blue = smaller. Shares, not times, so ranges of unequal traffic compare.
import { el, formatNs, getJSON, table, ui } from "./common.js";
import { RANGE_FIELDS } from "./flame.js";
import { filterForm } from "./form.js";
import { Icicle, buildTree, icicleToolbar } from "./icicle.js";

const HOUR_MS = 3600 * 1000;

function defaults(params) {
  const now = Date.now();
  const iso = (ms) => new Date(ms).toISOString();
  return {
    before_since: iso(now - 25 * HOUR_MS),
    before_until: iso(now - HOUR_MS),
    after_since: iso(now - HOUR_MS),
    after_until: iso(now + 60000),
    ...params,
  };
}

const share = (node, s, root) => node.total[s] / Math.max(1, root.total[s]);
const pct = (x) => `${(100 * x).toFixed(1)}%`;

// Per function: self time in each range and the change of its share.
function changes(stacks, roots) {
  const rows = new Map();
  stacks.forEach((list, s) => {
    for (const { stack, self_ns: self } of list) {
      const name = stack.slice(stack.lastIndexOf(";") + 1);
      const row = rows.get(name) || { function: name, before: 0, after: 0 };
      row[s ? "after" : "before"] += self;
      rows.set(name, row);
    }
  });
  return [...rows.values()].map((row) => ({
    ...row,
    change: row.after / Math.max(1, roots[1]) - row.before / Math.max(1, roots[0]),
  }));
}

export async function diffView(root, raw) {
  const params = defaults(raw);
  const scope = { service: params.service, route: params.route };
  const [before, after] = await Promise.all(
    ["before", "after"].map((side) =>
      getJSON("/api/flamegraph", {
        ...scope,
        since: params[`${side}_since`],
        until: params[`${side}_until`],
        format: "json",
      }),
    ),
  );
  const tree = buildTree([before.stacks, after.stacks]);
  const delta = (n) => share(n, 1, tree) - share(n, 0, tree);
  let biggest = 1e-9;
  for (const todo = [tree]; todo.length; ) {
    const n = todo.pop();
    biggest = Math.max(biggest, Math.abs(delta(n)));
    todo.push(...n.children);
  }
  const chartBox = el("div", { class: "chart-box" });
  const icicle = new Icicle(chartBox, tree, {
    name: "diff",
    value: (n) => n.total[1],
    colour: (n) => {
      const d = delta(n) / biggest;
      const light = 92 - 42 * Math.min(1, Math.abs(d));
      return d >= 0 ? `hsl(0 80% ${light}%)` : `hsl(215 80% ${light}%)`;
    },
    describe: (n) => [
      ["", n.name],
      ["before", `${formatNs(n.total[0])} (${pct(share(n, 0, tree))})`],
      ["after", `${formatNs(n.total[1])} (${pct(share(n, 1, tree))})`],
      ["change of share", `${delta(n) >= 0 ? "+" : ""}${pct(delta(n))}`],
    ],
  });
  const fields = [
    ...RANGE_FIELDS,
    ["before_since", "before: from", "time"],
    ["before_until", "to", "time"],
    ["after_since", "after: from", "time"],
    ["after_until", "to", "time"],
  ];
  const rows = changes([before.stacks, after.stacks], tree.total);
  root.replaceChildren(
    filterForm("diff", fields, params, "Compare"),
    el(
      "p",
      { class: "hint" },
      `before: ${before.stacks.length} stacks, ${formatNs(tree.total[0])}; after: `,
      `${after.stacks.length} stacks, ${formatNs(tree.total[1])}. Sized by after; `,
      el("span", { class: "up" }, "red: larger share"),
      ", ",
      el("span", { class: "down" }, "blue: smaller share"),
    ),
    icicleToolbar(icicle),
    chartBox,
    el("h3", {}, "Self time by function, largest share gain first"),
    table(
      [
        ["function", "function"],
        ["before", "before", formatNs],
        ["after", "after", formatNs],
        ["change of share", "change", (v) => `${v >= 0 ? "+" : ""}${pct(v)}`],
      ],
      rows,
      { sortKey: "change" },
    ),
  );
  icicle.draw();
  ui.loaded = { ...ui.loaded, diff: performance.now() };
  return () => icicle.draw();
}
