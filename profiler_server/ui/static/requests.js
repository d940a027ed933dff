// The request list: the time range, filters (service and route picked from the stored
// requests), one page of the slowest or newest requests with the total, and a duration
// histogram of one route of the range (click a bar to list the requests in it).
import { el, formatMs, getJSON, table } from "./common.js";
import { filterForm, go, rangeBar } from "./form.js";
import { histogram } from "./histogram.js";
import { linkPickers, loadServices, pickerFields, routesOf } from "./pickers.js";
import { resolveRange } from "./timerange.js";

const PAGE = 100;
const HISTOGRAM_SAMPLES = 1000; // the API's largest page

const FIELDS = [
  ["status", "status", "text"],
  ["min_duration_ms", "min ms", "number"],
  ["max_duration_ms", "max ms", "number"],
  ["function", "called function", "text"],
  ["order", "sort by", "text", ["duration", "start"]],
  ["limit", "page size", "number"],
];

async function routeHistogram(container, params, range, route) {
  const { service } = params;
  const query = { service, route, ...range, order: "start", limit: HISTOGRAM_SAMPLES };
  const { requests, total, total_capped: capped } = await getJSON("/api/requests", query);
  if (!requests.length) return container.replaceChildren("no requests in this range");
  const caption = el(
    "p",
    { class: "hint", id: "histogram-caption" },
    total > requests.length
      ? `the newest ${requests.length.toLocaleString()} of ${capped ? "over " : ""}${total.toLocaleString()} requests`
      : `${total.toLocaleString()} request${total === 1 ? "" : "s"}`,
  );
  const plot = el("div");
  container.replaceChildren(caption, plot);
  histogram(plot, requests.map((r) => r.duration_ms), (bar) =>
    go("requests", {
      ...params,
      route,
      offset: "",
      min_duration_ms: Math.floor(bar.from * 1000) / 1000,
      max_duration_ms: Math.ceil(bar.to * 1000) / 1000,
    }),
  );
}

// "1–100 of 2,345 requests" (the API stops counting at 100,000: "of over 100,000").
function pager(params, offset, limit, shown, { total, total_capped: capped }) {
  const to = (next) => () => go("requests", { ...params, offset: next });
  const of = `of ${capped ? "over " : ""}${total.toLocaleString()} requests`;
  const info = shown
    ? `${(offset + 1).toLocaleString()}–${(offset + shown).toLocaleString()} ${of}`
    : `0 ${of}`;
  const last = shown < limit || (!capped && offset + shown >= total);
  return el(
    "div",
    { class: "toolbar pager" },
    el("button", { id: "prev", disabled: offset <= 0, onclick: to(Math.max(0, offset - limit)) }, "‹ Previous"),
    el("span", { id: "page-info" }, info),
    el("button", { id: "next", disabled: last, onclick: to(offset + limit) }, "Next ›"),
  );
}

export async function requestsView(root, params) {
  const range = resolveRange(params);
  const limit = Number(params.limit) || PAGE;
  const offset = Number(params.offset) || 0;
  const query = { order: "duration", ...params, since: range.since, until: range.until };
  delete query.range;
  const [page, services] = await Promise.all([
    getJSON("/api/requests", { ...query, limit, offset }),
    loadServices(range),
  ]);
  const { requests } = page;
  const known = routesOf(services, params.service);
  const chosen = params.route || requests[0]?.route || known[0];
  const routes = chosen && !known.includes(chosen) ? [...known, chosen] : known;
  const plot = el("div", { class: "chart-box histogram" });
  const picker = el(
    "select",
    { id: "histogram-route", onchange: () => routeHistogram(plot, params, range, picker.value) },
    routes.map((r) => el("option", { value: r }, r)),
  );
  picker.value = chosen;
  const rows = requests.map((r) => ({ ...r, when: new Date(r.start).toLocaleString() }));
  const form = filterForm("requests", [...pickerFields(services, params), ...FIELDS], params);
  linkPickers(form, services);
  root.replaceChildren(
    rangeBar("requests", params),
    form,
    el("div", { class: "toolbar" }, el("h3", {}, "Duration histogram of route "), picker),
    plot,
    pager(params, offset, limit, requests.length, page),
    table(
      [
        ["start", "when"],
        ["service", "service"],
        ["method", "method"],
        ["route", "route"],
        ["status", "status", (v) => `${v ?? "—"}`],
        ["duration", "duration_ms", formatMs],
        ["calls", "calls"],
        ["truncated", "truncated", (v) => (v ? "yes" : "")],
      ],
      rows,
      {
        sortKey: params.order === "start" ? "start" : "duration_ms",
        onRow: (row) => go(`request/${encodeURIComponent(row.id)}`),
        rowAttrs: (row) => ({ "data-id": row.id, class: "link" }),
      },
    ),
  );
  if (chosen) await routeHistogram(plot, params, range, chosen);
  return () => chosen && routeHistogram(plot, params, range, picker.value);
}
