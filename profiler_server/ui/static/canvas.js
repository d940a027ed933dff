// Canvas plumbing shared by the flame chart, the icicle and the histogram.
import { ui } from "./common.js";

export const ROW = 17;
const FONT = "11px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
let charWidth = 0;

// Sizes the canvas for the device's pixel ratio; returns a context drawing in CSS pixels.
export function sizeCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.font = FONT;
  ctx.textBaseline = "middle";
  if (!charWidth) charWidth = ctx.measureText("M").width;
  return ctx;
}

// `module:qualname` shortened to fit `width` pixels (qualname first, then cut), or "".
function fitLabel(text, width) {
  const room = Math.floor((width - 6) / charWidth);
  if (room < 3) return "";
  if (text.length <= room) return text;
  const short = text.slice(text.lastIndexOf(":") + 1);
  if (short.length <= room) return short;
  return `${short.slice(0, room - 1)}…`;
}

// A box with its label; `decorate` paints over the fill (under the label); `extra` lands in
// the drawn record tests read.
export function box(ctx, drawn, x, y, w, h, fill, text, extra, decorate) {
  ctx.fillStyle = fill;
  ctx.fillRect(x, y, w, h);
  if (decorate) decorate();
  const shown = fitLabel(text, w);
  if (shown) {
    ctx.fillStyle = "#1a1a1a";
    ctx.fillText(shown, x + 3, y + h / 2 + 0.5);
  }
  drawn.push({ label: text, x, y, w, h, ...extra });
}

const patterns = new WeakMap();
// Diagonal stripes: a coroutine's time spent suspended.
export function hatch(ctx) {
  let pattern = patterns.get(ctx);
  if (!pattern) {
    const tile = document.createElement("canvas");
    tile.width = tile.height = 6;
    const t = tile.getContext("2d");
    t.strokeStyle = "rgba(0,0,0,0.28)";
    t.beginPath();
    t.moveTo(0, 6);
    t.lineTo(6, 0);
    t.stroke();
    pattern = ctx.createPattern(tile, "repeat");
    patterns.set(ctx, pattern);
  }
  return pattern;
}

// Runs a draw, recording what it drew and how long it took (performance.now) under `name`.
export function timed(name, draw) {
  const drawn = [];
  const started = performance.now();
  draw(drawn);
  ui.renders[name] = performance.now() - started;
  ui.draws[name] = (ui.draws[name] || 0) + 1;
  ui.drawn[name] = drawn;
}
