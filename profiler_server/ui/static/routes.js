// The landing page: every service and route of the time range, from the requests the hosts
// counted (sampled or not, `/api/routes`): rate, errors, percentiles, how many were sampled,
// and a link to the slowest sampled ones (the request list of the route, by duration).
import { apiURL, el, formatMs, getJSON, table } from "./common.js";
import { rangeBar } from "./form.js";
import { rangeParams, resolveRange } from "./timerange.js";

const percent = (share) => `${(share * 100).toFixed(share > 0 && share < 0.001 ? 3 : 1)} %`;
const rate = (perSecond) => (perSecond >= 10 ? perSecond.toFixed(0) : perSecond.toPrecision(2));
const ms = (value) => (value === null ? "—" : formatMs(value));

function slowestLink(row, params) {
  if (!row.sampled) return "none sampled";
  const query = { ...rangeParams(params), service: row.service, route: row.route, order: "duration" };
  return el("a", { class: "slowest", href: apiURL("#/requests", query) }, `${row.sampled.toLocaleString()} ›`);
}

export async function routesView(root, params) {
  const range = resolveRange(params);
  const answer = await getJSON("/api/routes", { since: range.since, until: range.until });
  const rows = answer.routes;
  const total = rows.reduce((sum, r) => sum + r.requests, 0);
  root.replaceChildren(
    rangeBar("routes", params),
    el(
      "p",
      { class: "hint", id: "routes-caption" },
      rows.length
        ? `${rows.length.toLocaleString()} route${rows.length === 1 ? "" : "s"}, ` +
            `${total.toLocaleString()} requests counted (sampled or not); click a heading to sort`
        : "no requests counted in this range",
    ),
    table(
      [
        ["service", "service"],
        ["route", "route"],
        ["requests/s", "rate_per_s", rate],
        ["requests", "requests", (v) => v.toLocaleString()],
        ["error %", "error_rate", percent],
        ["p50", "p50_ms", ms],
        ["p95", "p95_ms", ms],
        ["p99", "p99_ms", ms],
        ["sampled (slowest)", "sampled", (_, row) => slowestLink(row, params)],
      ],
      rows,
      { sortKey: "rate_per_s", rowAttrs: (row) => ({ "data-route": row.route, "data-service": row.service }) },
    ),
  );
}
