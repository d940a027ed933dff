// Two time ranges compared (what got slower after a deploy): both flame graphs fetched and
// diffed here. Frames are sized by the later range; red = a larger share of its range's
// time than before, blue = smaller. Shares, not times, so ranges of unequal traffic compare.
import { el, formatNs, table, ui } from "./common.js";
import { rangeStacks } from "./flame.js";
import { filterForm, rangeBar } from "./form.js";
import { linkPickers, loadServices, pickerFields } from "./pickers.js";
import { resolveRange } from "./timerange.js";
import { Icicle, buildTree, icicleToolbar } from "./icicle.js";

// "after" is the view's time range; "before" is the window of the same length just before
// it, unless the URL names one (before_since, before_until).
function windows(params) {
  const now = Date.now();
  let after = resolveRange(params, now);
  if (!after.since) after = resolveRange({}, now); // an open start has no length
  const until = after.until ? Date.parse(after.until) : now;
  const span = until - Date.parse(after.since);
  const iso = (ms) => new Date(ms).toISOString();
  const before = {
    since: params.before_since || iso(Date.parse(after.since) - span),
    until: params.before_until || after.since,
  };
  return { before, after: { since: after.since, until: iso(until) } };
}

const when = ({ since, until }) =>
  `${new Date(since).toLocaleString()} – ${new Date(until).toLocaleString()}`;

// Says so when a side has nothing: a diff against nothing is no diff.
function emptySides(sides, stacks) {
  const empty = ["before", "after"].filter((_, i) => !stacks[i].length);
  if (!empty.length) return ""; // nothing shown (replaceChildren would print null)
  const lines = empty.map(
    (side) => `The ${side} range (${when(sides[side])}) holds no stacks: nothing to compare.`,
  );
  const advice = "Pick a longer time range, or other dates.";
  return el("p", { class: "warn notice", id: "empty-side" }, lines.join(" "), " ", advice);
}

const share = (node, s, root) => node.total[s] / Math.max(1, root.total[s]);
const pct = (x) => `${(100 * x).toFixed(1)}%`;

// Per function: self time in each range and the change of its share.
function changes(stacks, roots) {
  const rows = new Map();
  stacks.forEach((list, s) => {
    for (const { stack, value: self } of list) {
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

export async function diffView(root, params) {
  const sides = windows(params);
  const scope = { service: params.service, route: params.route };
  const services = await loadServices({ since: sides.before.since, until: sides.after.until });
  const [before, after] = await Promise.all(
    [sides.before, sides.after].map((side) => rangeStacks(scope, side, services)),
  );
  const tree = buildTree([before, after]);
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
    ...pickerFields(services, params),
    ["before_since", "before: from (blank: the preceding window)", "time"],
    ["before_until", "before: to", "time"],
  ];
  const form = filterForm("diff", fields, params, "Compare");
  linkPickers(form, services);
  const rows = changes([before, after], tree.total);
  root.replaceChildren(
    rangeBar("diff", params),
    form,
    el("p", { class: "hint", id: "sides" }, `before: ${when(sides.before)} · after: ${when(sides.after)}`),
    emptySides(sides, [before, after]),
    el(
      "p",
      { class: "hint" },
      `before: ${before.length} stacks, ${formatNs(tree.total[0])}; after: `,
      `${after.length} stacks, ${formatNs(tree.total[1])}. Sized by after; `,
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
