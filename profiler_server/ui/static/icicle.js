// Aggregated stacks as an icicle (root on top, callees below, width = time), with search
// highlighting and click-to-zoom. One tree holds one series (a flame graph) or two (a diff).
import { ROW, box, sizeCanvas, timed } from "./canvas.js";
import { el, hideTooltip, showTooltip, ui } from "./common.js";

const MATCH_COLOUR = "#d63ea0";
const DIM_COLOUR = "#dcdcdc";

function frame(name, parent, series) {
  const zeros = () => new Array(series).fill(0);
  return { name, parent, total: zeros(), self: zeros(), calls: zeros(), children: new Map() };
}

// [[{stack: "a;b;c", value, calls}, ...], ...] -> root frame; children sorted by name.
export function buildTree(series) {
  const root = frame("all", null, series.length);
  series.forEach((stacks, s) => {
    for (const { stack, value: self, calls } of stacks) {
      let node = root;
      node.total[s] += self;
      for (const name of stack.split(";")) {
        let child = node.children.get(name);
        if (!child) {
          child = frame(name, node, series.length);
          node.children.set(name, child);
        }
        child.total[s] += self;
        node = child;
      }
      node.self[s] += self;
      node.calls[s] += calls;
    }
  });
  let depth = 0;
  const todo = [[root, 0]];
  while (todo.length) {
    const [node, d] = todo.pop();
    depth = Math.max(depth, d);
    node.children = [...node.children.values()].sort((a, b) => (a.name < b.name ? -1 : 1));
    for (const child of node.children) todo.push([child, d + 1]);
  }
  root.depth = depth;
  return root;
}

export class Icicle {
  // options: name (for timings), value(node), colour(node), describe(node) -> tooltip lines.
  constructor(container, root, options) {
    Object.assign(this, options);
    this.root = root;
    this.zoom = root;
    this.search = "";
    this.canvas = el("canvas", { class: "chart", "aria-label": `${options.name} icicle` });
    container.append(this.canvas);
    this.listen();
  }

  setSearch(text) {
    this.search = text.trim().toLowerCase();
    this.draw();
  }

  matches(node) {
    return this.search !== "" && node.name.toLowerCase().includes(this.search);
  }

  draw() {
    timed(this.name, (drawn) => this.paint(drawn));
  }

  paint(drawn) {
    const width = Math.max(200, this.canvas.parentElement.clientWidth);
    const ctx = sizeCanvas(this.canvas, width, (this.root.depth + 1) * ROW);
    this.hits = [];
    const put = (node, x, y, w, extra) => {
      const match = this.matches(node);
      const fill = match ? MATCH_COLOUR : this.search ? DIM_COLOUR : this.colour(node);
      box(ctx, drawn, x, y, w - (w > 3 ? 1 : 0), ROW - 1, fill, node.name, { match, ...extra });
      this.hits.push({ x, y, w, node });
    };
    const chain = [];
    for (let n = this.zoom.parent; n; n = n.parent) chain.unshift(n);
    chain.forEach((node, depth) => put(node, 0, depth * ROW, width, { depth, ancestor: true }));
    const scale = width / Math.max(1, this.value(this.zoom));
    let matched = 0;
    const todo = [[this.zoom, 0, chain.length, false]];
    while (todo.length) {
      const [node, x, depth, inMatch] = todo.pop();
      const w = this.value(node) * scale;
      if (w < 0.5) continue;
      put(node, x, depth * ROW, w, { depth });
      const match = inMatch || this.matches(node);
      if (match && !inMatch) matched += this.value(node);
      let cx = x;
      for (const child of node.children) {
        todo.push([child, cx, depth + 1, match]);
        cx += this.value(child) * scale;
      }
    }
    ui.search = { text: this.search, share: matched / Math.max(1, this.value(this.zoom)) };
  }

  at(event) {
    const rect = this.canvas.getBoundingClientRect();
    const x = event.clientX - rect.left;
    const y = event.clientY - rect.top;
    return this.hits.find((h) => x >= h.x && x < h.x + h.w && y >= h.y && y < h.y + ROW);
  }

  listen() {
    this.canvas.addEventListener("mousemove", (event) => {
      const hit = this.at(event);
      if (hit) showTooltip(event, this.describe(hit.node));
      else hideTooltip();
    });
    this.canvas.addEventListener("mouseleave", hideTooltip);
    this.canvas.addEventListener("click", (event) => {
      const hit = this.at(event);
      if (hit) this.zoomTo(hit.node);
    });
  }

  zoomTo(node) {
    this.zoom = node;
    this.draw();
  }
}

// The search box and zoom reset above an icicle.
export function icicleToolbar(icicle) {
  const info = el("span", { class: "hint", id: "search-info" });
  const show = () => {
    info.textContent = icicle.search
      ? `matches: ${(ui.search.share * 100).toFixed(1)}% of the shown time`
      : "click a frame to zoom in, an upper one to zoom out";
  };
  const input = el("input", {
    type: "search",
    id: "search",
    placeholder: "search functions (substring)",
    oninput: () => {
      icicle.setSearch(input.value);
      show();
    },
  });
  show();
  const reset = () => icicle.zoomTo(icicle.root);
  const button = el("button", { id: "zoom-reset", onclick: reset }, "Reset zoom");
  return el("div", { class: "toolbar" }, input, button, info);
}
