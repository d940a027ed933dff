// Shared by every view: the JSON API, formatting, small DOM helpers, colours, the tooltip,
// and `window.__profilerUI` (what the canvases drew and how long drawing took, for tests).

export const ui = (window.__profilerUI = { view: null, drawn: {}, renders: {}, draws: {} });

export function apiURL(path, params = {}) {
  const query = new URLSearchParams(
    Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== ""),
  ).toString();
  return query ? `${path}?${query}` : path;
}

// The server asks for its read token (401: none sent, 403: a wrong one): the UI logs in.
export class LoginNeeded extends Error {}

export async function getJSON(path, params = {}) {
  const response = await fetch(apiURL(path, params));
  const body = await response.json();
  if (response.status === 401 || response.status === 403) throw new LoginNeeded(body.error);
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// Each unit from where its rounded figure would reach 1000 of the unit below (no "1000 µs").
export function formatNs(ns) {
  if (ns >= 999.5e6) return `${(ns / 1e9).toFixed(2)} s`;
  if (ns >= 999.5e3) return `${(ns / 1e6).toFixed(ns >= 99.95e6 ? 0 : 1)} ms`;
  if (ns >= 999.5) return `${(ns / 1e3).toFixed(0)} µs`;
  return `${Math.round(ns)} ns`;
}

export const formatMs = (ms) => formatNs(ms * 1e6);

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) {
      node.setAttribute(key, value);
    }
  }
  node.append(...children.flat().filter((c) => c !== null && c !== undefined));
  return node;
}

// Download links to what is shown, in other tools' formats (the API's export paths).
export function exportLinks(path, params, formats) {
  const links = formats.map(([format, label]) =>
    el("a", { class: "export", download: "", href: apiURL(path, { ...params, format }) }, label),
  );
  return el("span", { class: "exports" }, "Export: ", ...links.flatMap((a) => [a, " "]));
}

export function setStatus(text) {
  document.getElementById("status").textContent = text;
}

// Hue from the module (so one module's functions look alike), lightness from the name.
const colours = new Map();
export function colourFor(name) {
  let found = colours.get(name);
  if (found) return found;
  const module = name.split(":")[0];
  const hue = 10 + (hash(module) % 45);
  const light = 58 + (hash(name) % 14);
  found = `hsl(${hue} 85% ${light}%)`;
  colours.set(name, found);
  return found;
}

function hash(text) {
  let h = 2166136261;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619);
  return h >>> 0;
}

export function showTooltip(event, lines) {
  const tip = document.getElementById("tooltip");
  tip.replaceChildren(...lines.map(([k, v]) => el("div", {}, el("b", {}, k), " ", v)));
  tip.hidden = false;
  const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
  const y = Math.min(event.clientY + 14, window.innerHeight - tip.offsetHeight - 4);
  tip.style.left = `${x}px`;
  tip.style.top = `${y}px`;
}

export function hideTooltip() {
  document.getElementById("tooltip").hidden = true;
}

// <input type="datetime-local"> value (local time) <-> ISO-8601 UTC for the API.
export const toIso = (local) => (local ? new Date(local).toISOString() : "");
export function toLocal(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
}

// A sortable table: columns = [[title, key, format?]], rows = objects. Past maxRows (a big
// request's thousands of functions would slow every layout of the page) it shows the first
// rows in the current order, and a line saying how many more.
export function table(columns, rows, { sortKey, onRow, rowAttrs, maxRows = Infinity } = {}) {
  let key = sortKey;
  let descending = true;
  const body = el("tbody");
  const fill = () => {
    const sorted = [...rows].sort((a, b) => {
      const order = a[key] < b[key] ? -1 : a[key] > b[key] ? 1 : 0;
      return descending ? -order : order;
    });
    const more = sorted.length - maxRows;
    const text = `${more.toLocaleString()} more: sort by a column to see others`;
    const note = el("tr", { class: "more" }, el("td", { colspan: columns.length }, text));
    body.replaceChildren(
      ...sorted.slice(0, maxRows).map((row) =>
        el(
          "tr",
          { ...rowAttrs?.(row), onclick: onRow && (() => onRow(row)) },
          columns.map(([, k, format]) => el("td", {}, format ? format(row[k], row) : `${row[k]}`)),
        ),
      ),
      ...(more > 0 ? [note] : []),
    );
  };
  const head = columns.map(([title, k]) =>
    el("th", {
      onclick: () => {
        descending = key === k ? !descending : true;
        key = k;
        fill();
      },
    }, title),
  );
  fill();
  return el("table", { class: "grid" }, el("thead", {}, el("tr", {}, head)), body);
}
