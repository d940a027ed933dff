// The flame chart of one request: time on x, call depth on y, one band per lane (thread or
// task) with a marker where it was spawned. A call that suspended (coroutine, generator) is
// solid while it ran, faded and striped while it awaited, amber while it was ready but waited
// for the event loop. Where its waits were not kept (over the store's cap per request) it is
// striped whole, with a strip at its foot splitting its wall time into those three.
import { ROW, box, hatch, sizeCanvas, timed } from "./canvas.js";
import { colourFor, el, formatNs, hideTooltip, showTooltip, ui } from "./common.js";

const LANE_GAP = 10;
const LANE_COLOURS = { main: "#c8d4e3", task: "#cde6cd", thread: "#e2d5f0", executor: "#f0e0c6" };
export const AWAIT_COLOUR = "#8d99a6";
export const READY_COLOUR = "#f0a500";
const MIN_SPAN_NS = 1000;
const AXIS_HEIGHT = 20;
const TICK_PX = 90;
const UNITS = [
  [1e9, "s"],
  [1e6, "ms"],
  [1e3, "µs"],
  [1, "ns"],
];

// 1, 2 or 5 times a power of ten ns, so ticks land about TICK_PX apart.
function tickStep(span, width) {
  const target = (span * TICK_PX) / width;
  const power = 10 ** Math.floor(Math.log10(Math.max(1, target)));
  return [1, 2, 5, 10].map((m) => m * power).find((step) => step >= target);
}

// `t` in the unit of `step`, with as many decimals as the step needs (12.35 ms, not 12.3).
function tickLabel(t, step) {
  const [size, unit] = UNITS.find(([size]) => step >= size || size === 1);
  const decimals = Math.max(0, Math.ceil(-Math.log10(step / size) - 1e-9));
  return `${(t / size).toFixed(decimals)} ${unit}`;
}

function isMain(lane) {
  return lane.kind === "main" ? 0 : 1;
}

// The first row below `parentRow` where [start, end) overlaps nothing already on the row
// (rows: per row, its intervals sorted by start).
function place(rows, parentRow, start, end) {
  for (let r = parentRow + 1; ; r++) {
    const row = rows[r] || (rows[r] = []);
    if (!row.length || row[row.length - 1][1] <= start) {
      row.push([start, end]); // the usual case: calls come in time order
      return r;
    }
    let lo = 0;
    let hi = row.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (row[mid][0] < start) lo = mid + 1;
      else hi = mid;
    }
    if ((lo > 0 && row[lo - 1][1] > start) || (lo < row.length && row[lo][0] < end)) continue;
    row.splice(lo, 0, [start, end]);
    return r;
  }
}

// Depth first, a row's calls come in time order unless calls interleave.
function inTimeOrder(row) {
  for (let i = 1; i < row.length; i++) {
    if (row[i].node.start_ns < row[i - 1].node.start_ns) return false;
  }
  return true;
}

// Lanes -> flat items {node, lane, depth, y} (main lanes first, then by start) and bands.
// A call sits on the first row below its caller that is free over its time, so calls that
// interleave (a generator and the loop consuming it) stack instead of overlapping. Items
// come row by row, each row in time order: the order paint() needs to keep boxes apart.
function layout(lanes) {
  const ordered = [...lanes].sort(
    (a, b) => isMain(a) - isMain(b) || a.root.start_ns - b.root.start_ns,
  );
  const items = [];
  const byNode = new Map();
  const laneRoots = new Map();
  const bands = [];
  let top = 0;
  for (const lane of ordered) {
    let deepest = 0;
    const rows = [];
    const rowItems = [];
    const todo = [[lane.root, 0]];
    while (todo.length) {
      const [node, depth] = todo.pop();
      const item = { node, lane, depth, y: top + depth * ROW };
      (rowItems[depth] ||= []).push(item);
      byNode.set(node.id, item);
      if (depth === 0) laneRoots.set(lane.id, item);
      if (depth > deepest) deepest = depth;
      const placed = node.children.map((c) => [c, place(rows, depth, c.start_ns, c.end_ns)]);
      for (let i = placed.length - 1; i >= 0; i--) todo.push(placed[i]);
    }
    for (const row of rowItems) {
      if (!inTimeOrder(row)) row.sort((a, b) => a.node.start_ns - b.node.start_ns);
      for (const item of row) items.push(item);
    }
    bands.push({ lane, top, height: (deepest + 1) * ROW });
    top += (deepest + 1) * ROW + LANE_GAP;
  }
  const end = Math.max(1, ...lanes.map((lane) => lane.root.end_ns));
  return { items, byNode, laneRoots, bands, height: Math.max(top, ROW), end };
}

// A node's label: a summary's merged calls show their count, calls left out a "▸".
function label(n) {
  const count = n.calls > 1 ? ` ×${n.calls}` : "";
  return `${n.function}${count}${n.hidden ? " ▸" : ""}`;
}

export class FlameChart {
  // onExpand(node): for a summary's node with calls left out (double-click); it adds the
  // node's children, then relayout() places them.
  constructor(container, lanes, sources, onSelect, onExpand = null) {
    this.lanes = lanes;
    this.relayout();
    this.sources = sources;
    this.onSelect = onSelect;
    this.onExpand = onExpand;
    this.t0 = 0;
    this.t1 = this.end;
    this.highlight = null;
    this.canvas = el("canvas", { class: "chart", "aria-label": "request timeline" });
    this.axis = el("canvas", { class: "axis", "aria-label": "time axis" });
    container.append(this.axis, this.canvas);
    this.listen();
  }

  relayout() {
    const started = performance.now();
    Object.assign(this, layout(this.lanes));
    ui.layouts = { ...ui.layouts, timeline: performance.now() - started };
  }

  get width() {
    return Math.max(200, this.canvas.parentElement.clientWidth);
  }

  redraw() {
    if (this.pending) return;
    this.pending = requestAnimationFrame(() => {
      this.pending = 0;
      this.draw();
    });
  }

  draw() {
    timed("timeline", (drawn) => this.paint(drawn));
    timed("axis", (drawn) => this.paintAxis(drawn));
    ui.timelineView = { t0: this.t0, t1: this.t1, end: this.end };
  }

  // Time since the request began, over the part shown: ticks about every 90 px.
  paintAxis(drawn) {
    const width = this.width;
    const ctx = sizeCanvas(this.axis, width, AXIS_HEIGHT);
    const scale = width / (this.t1 - this.t0);
    const step = tickStep(this.t1 - this.t0, width);
    ctx.fillStyle = "#56606b";
    for (let i = Math.ceil(this.t0 / step); i * step <= this.t1; i++) {
      const t = i * step;
      const x = (t - this.t0) * scale;
      const label = tickLabel(t, step);
      ctx.fillRect(Math.round(x), AXIS_HEIGHT - 5, 1, 5);
      ctx.textAlign = x < 30 ? "left" : x > width - 30 ? "right" : "center";
      ctx.fillText(label, x, AXIS_HEIGHT / 2 - 2);
      drawn.push({ label, t, x, y: 0, w: 0, h: AXIS_HEIGHT, step });
    }
    ctx.textAlign = "left";
  }

  paint(drawn) {
    const width = this.width;
    const ctx = sizeCanvas(this.canvas, width, this.height);
    const scale = width / (this.t1 - this.t0);
    this.bands.forEach((band, i) => {
      ctx.fillStyle = i % 2 ? "#f4f5f7" : "#fbfbfc";
      ctx.fillRect(0, band.top, width, band.height);
    });
    let row = -1;
    let right = 0; // where the row's last box ends: a box never starts left of it
    for (const item of this.items) {
      const n = item.node;
      if (item.y !== row) {
        row = item.y;
        right = 0;
      }
      let x = (n.start_ns - this.t0) * scale;
      let w = (n.end_ns - n.start_ns) * scale;
      if (x < right) {
        w -= right - x;
        x = right;
      }
      if (x + w <= 0 || x >= width || (w < 0.4 && item.depth > 0)) continue;
      w = Math.max(1, Math.min(w, width - x));
      right = x + w;
      if (item.depth === 0) {
        const text = `${item.lane.kind}: ${item.lane.name}`;
        const extra = { lane: item.lane.id, kind: item.lane.kind, root: true };
        box(ctx, drawn, x, item.y, w, ROW - 1, LANE_COLOURS[item.lane.kind], text, extra);
        continue;
      }
      const suspended = n.suspensions > 0;
      const extra = { id: n.id, lane: item.lane.id, depth: item.depth, suspended, waits: 0 };
      if (n.hidden) extra.hidden = n.hidden;
      const gap = w > 3 ? 1 : 0;
      const decorate =
        suspended && (() => this.suspension(ctx, n, x, item.y, w - gap, scale, extra));
      const fill = colourFor(n.function);
      box(ctx, drawn, x, item.y, w - gap, ROW - 1, fill, label(n), extra, decorate);
      if (n.outcome !== "return" || n.function === this.highlight) {
        ctx.strokeStyle = n.function === this.highlight ? "#d0008a" : "#c0392b";
        ctx.lineWidth = n.function === this.highlight ? 2 : 1;
        ctx.strokeRect(x + 0.5, item.y + 0.5, Math.max(1, w - gap - 1), ROW - 2);
      }
    }
    this.spawnMarkers(ctx, scale, width);
  }

  // Each wait over the box: awaiting faded and striped, then ready-waiting in amber.
  suspension(ctx, n, x, y, w, scale, extra) {
    if (!n.waits) return this.proportions(ctx, n, x, y, w);
    for (const wait of n.waits) {
      const from = Math.max(x, (wait.start_ns - this.t0) * scale);
      const ready = Math.min(x + w, ((wait.ready_ns ?? wait.end_ns) - this.t0) * scale);
      const to = Math.min(x + w, (wait.end_ns - this.t0) * scale);
      if (to - from < 0.2) continue;
      if (ready > from) this.faded(ctx, from, y, ready - from);
      if (to > ready) {
        ctx.fillStyle = READY_COLOUR;
        ctx.fillRect(Math.max(from, ready), y, to - Math.max(from, ready), ROW - 1);
      }
      extra.waits += 1;
    }
  }

  faded(ctx, x, y, w) {
    ctx.fillStyle = "rgba(255,255,255,0.6)";
    ctx.fillRect(x, y, w, ROW - 1);
    ctx.fillStyle = hatch(ctx);
    ctx.fillRect(x, y, w, ROW - 1);
  }

  // Waits not kept: the whole box striped; the strip at its foot: active | await | ready.
  proportions(ctx, n, x, y, w) {
    this.faded(ctx, x, y, w);
    const wall = Math.max(1, n.end_ns - n.start_ns);
    let cx = x;
    for (const [ns, colour] of [
      [n.active_ns, colourFor(n.function)],
      [n.await_ns, AWAIT_COLOUR],
      [n.ready_ns, READY_COLOUR],
    ]) {
      const part = (w * ns) / wall;
      ctx.fillStyle = colour;
      ctx.fillRect(cx, y + ROW - 5, part, 4);
      cx += part;
    }
  }

  // A dashed line from the spawning call (else the spawning lane) down to the lane, ending in
  // a triangle.
  spawnMarkers(ctx, scale, width) {
    ctx.strokeStyle = "#333";
    ctx.fillStyle = "#333";
    ctx.setLineDash([3, 3]);
    for (const band of this.bands) {
      const { parent_node: node, parent_lane: lane } = band.lane;
      const parent = this.byNode.get(node) || this.laneRoots.get(lane);
      const x = (band.lane.root.start_ns - this.t0) * scale;
      if (!parent || x < 0 || x > width) continue;
      ctx.beginPath();
      ctx.moveTo(x, parent.y + ROW / 2);
      ctx.lineTo(x, band.top);
      ctx.stroke();
      ctx.beginPath();
      ctx.moveTo(x - 5, band.top - 1);
      ctx.lineTo(x + 5, band.top - 1);
      ctx.lineTo(x, band.top + 6);
      ctx.fill();
    }
    ctx.setLineDash([]);
  }

  zoomTo(t0, t1) {
    const span = Math.min(this.end, Math.max(MIN_SPAN_NS, t1 - t0));
    this.t0 = Math.max(0, Math.min(t0, this.end - span));
    this.t1 = this.t0 + span;
    this.redraw();
  }

  at(event) {
    const rect = this.canvas.getBoundingClientRect();
    const x = event.clientX - rect.left;
    const y = event.clientY - rect.top;
    const t = this.t0 + (x / rect.width) * (this.t1 - this.t0);
    const slack = (this.t1 - this.t0) / rect.width; // one pixel, for boxes thinner than one
    const near = (by) => (i) =>
      y >= i.y && y < i.y + ROW && t >= i.node.start_ns - by && t <= i.node.end_ns + by;
    const item = this.items.find(near(0)) || this.items.find(near(slack));
    return { x, t, item, width: rect.width };
  }

  listen() {
    const c = this.canvas;
    c.addEventListener("wheel", (event) => {
      event.preventDefault();
      const { t, x, width } = this.at(event);
      const span = (this.t1 - this.t0) * Math.exp(event.deltaY * 0.002);
      if (event.shiftKey) this.zoomTo(this.t0 + (event.deltaY * span) / width, this.t1);
      else this.zoomTo(t - (x / width) * span, t - (x / width) * span + span);
    });
    c.addEventListener("mousedown", (event) => {
      this.drag = { x: event.clientX, t0: this.t0, t1: this.t1, moved: false };
    });
    window.addEventListener("mouseup", () => {
      this.drag = null;
    });
    c.addEventListener("mousemove", (event) => {
      if (this.drag) {
        const dt = ((event.clientX - this.drag.x) / this.width) * (this.drag.t1 - this.drag.t0);
        this.drag.moved ||= Math.abs(event.clientX - this.drag.x) > 3;
        this.zoomTo(this.drag.t0 - dt, this.drag.t1 - dt);
      }
      const { item } = this.at(event);
      if (item) showTooltip(event, this.describe(item));
      else hideTooltip();
    });
    c.addEventListener("mouseleave", hideTooltip);
    c.addEventListener("click", (event) => {
      const { item } = this.at(event);
      if (item && item.depth > 0 && !this.drag?.moved) this.onSelect(item.node.function);
    });
    c.addEventListener("dblclick", (event) => {
      const { item } = this.at(event);
      if (!item) return;
      if (item.node.hidden && this.onExpand) this.onExpand(item.node);
      const margin = (item.node.end_ns - item.node.start_ns) * 0.02;
      this.zoomTo(item.node.start_ns - margin, item.node.end_ns + margin);
    });
  }

  describe({ node, lane, depth }) {
    const wall = node.end_ns - node.start_ns;
    if (depth === 0) {
      const spawner = this.byNode.get(lane.parent_node) || this.laneRoots.get(lane.parent_lane);
      return [
        [lane.kind, lane.name],
        ["wall", formatNs(wall)],
        ["spawned by", spawner ? `${spawner.node.function} (lane ${spawner.lane.id})` : "—"],
      ];
    }
    const merged = node.calls > 1 ? [["calls", `${node.calls} (merged)`]] : [];
    const hidden = node.hidden ? [["left out", `${node.hidden} calls below (double-click)`]] : [];
    return [
      ["", node.function],
      ["at", this.sources.get(node.function) || "?"],
      ...merged,
      ["wall", formatNs(node.wall_ns ?? wall)],
      ["self", formatNs(node.self_ns)],
      ["active", formatNs(node.active_ns)],
      ["await", formatNs(node.await_ns)],
      ["ready", formatNs(node.ready_ns)],
      ["suspensions", `${node.suspensions}${node.suspensions && !node.waits ? " (not kept)" : ""}`],
      ["outcome", node.outcome],
      ["lane", `${lane.kind} ${lane.name}`],
      ...hidden,
    ];
  }
}
