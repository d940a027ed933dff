// A duration histogram on log-scale bins, readable with one sample or 100,000: the number
// of bins grows with the samples (Rice's rule, 4 to 40), a bin of one request among
// thousands still shows as a bar, counts sit on the bars when they fit, and the axes name
// the scale (count on y, duration ticks on x).
import { sizeCanvas, timed } from "./canvas.js";
import { el, formatMs, hideTooltip, showTooltip } from "./common.js";

const HEIGHT = 120; // bars
const TOP = 14; // room for the counts over the bars
const LEFT = 44; // room for the count axis
const BOTTOM = 18; // duration ticks
const MIN_BAR = 3; // px: a non-empty bin is always visible
const MIN_RATIO = 1.25; // a narrower spread of durations is widened to this (few samples)

function binCount(samples) {
  return Math.max(4, Math.min(40, Math.ceil(2 * Math.cbrt(samples))));
}

// durations (ms, > 0) -> [{count, from, to}] on log-scale bins covering them all.
function bins(durations) {
  const n = binCount(durations.length);
  let low = Math.log(Math.max(1e-6, Math.min(...durations)));
  let high = Math.log(Math.max(1e-6, Math.max(...durations)));
  const widen = Math.max(0, Math.log(MIN_RATIO) - (high - low)) / 2;
  low -= widen + 1e-9;
  high += widen + 1e-9;
  const step = (high - low) / n;
  const counts = new Array(n).fill(0);
  for (const d of durations) {
    const i = Math.floor((Math.log(Math.max(1e-6, d)) - low) / step);
    counts[Math.max(0, Math.min(n - 1, i))]++;
  }
  return counts.map((count, i) => ({
    count,
    from: Math.exp(low + i * step),
    to: Math.exp(low + (i + 1) * step),
  }));
}

// Draws the histogram of `durations` into `container`; clicking a bar calls onPick(bar).
export function histogram(container, durations, onPick) {
  const canvas = el("canvas", { class: "chart", "aria-label": "duration histogram" });
  container.replaceChildren(canvas);
  const bars = bins(durations);
  const most = Math.max(...bars.map((b) => b.count));
  const width = Math.max(240, container.clientWidth);
  const barWidth = (width - LEFT) / bars.length;
  timed("histogram", (drawn) => {
    const ctx = sizeCanvas(canvas, width, TOP + HEIGHT + BOTTOM);
    ctx.fillStyle = "#333";
    ctx.textAlign = "right";
    ctx.fillText(`${most}`, LEFT - 6, TOP + 4);
    ctx.fillText("0", LEFT - 6, TOP + HEIGHT - 4);
    ctx.fillStyle = "#d5d9de";
    ctx.fillRect(LEFT - 2, TOP, 1, HEIGHT);
    ctx.fillRect(LEFT - 2, TOP + HEIGHT, width - LEFT + 2, 1);
    ctx.textAlign = "center";
    bars.forEach((bar, i) => {
      const h = bar.count ? Math.max(MIN_BAR, (HEIGHT * bar.count) / most) : 0;
      const x = LEFT + i * barWidth;
      const y = TOP + HEIGHT - h;
      ctx.fillStyle = "#e07b39";
      ctx.fillRect(x + 1, y, Math.max(1, barWidth - 2), h);
      if (bar.count && barWidth >= 8 * `${bar.count}`.length) {
        ctx.fillStyle = "#333";
        ctx.fillText(`${bar.count}`, x + barWidth / 2, y - 6);
      }
      drawn.push({ label: `${bar.count}`, bar: true, x, y, w: barWidth, h, ...bar });
    });
    ctx.fillStyle = "#333";
    const ticks = Math.min(bars.length, Math.max(2, Math.floor((width - LEFT) / 110)));
    for (let t = 0; t <= ticks; t++) {
      const i = (t * bars.length) / ticks;
      const ms = i < bars.length ? bars[Math.floor(i)].from : bars[bars.length - 1].to;
      const x = LEFT + i * barWidth;
      const label = formatMs(ms);
      ctx.textAlign = t === 0 ? "left" : t === ticks ? "right" : "center";
      ctx.fillText(label, x, TOP + HEIGHT + BOTTOM / 2 + 1);
      drawn.push({ label, tick: true, x, y: TOP + HEIGHT, w: 0, h: BOTTOM, ms });
    }
    ctx.textAlign = "left";
  });
  const barAt = (event) => bars[Math.floor((event.offsetX - LEFT) / barWidth)];
  canvas.addEventListener("mousemove", (event) => {
    const bar = barAt(event);
    const range = bar && `${formatMs(bar.from)} – ${formatMs(bar.to)}`;
    if (bar) showTooltip(event, [["requests", `${bar.count}`], ["duration", range]]);
    else hideTooltip();
  });
  canvas.addEventListener("mouseleave", hideTooltip);
  canvas.addEventListener("click", (event) => {
    const bar = barAt(event);
    if (bar?.count) onPick(bar);
  });
}
