// The time range every view shares, kept in the URL so a view is a link: `range=1h` (a
// preset: the last hour, as of when the view loads) or `since`/`until` (custom, ISO-8601
// UTC, either side may be open). A reload or a shared link shows the same range again.
import { el, toIso, toLocal } from "./common.js";

const MINUTE_MS = 60 * 1000;
const PRESETS = {
  "15m": ["last 15 min", 15 * MINUTE_MS],
  "1h": ["last 1 h", 60 * MINUTE_MS],
  "24h": ["last 24 h", 24 * 60 * MINUTE_MS],
  "7d": ["last 7 d", 7 * 24 * 60 * MINUTE_MS],
};
const DEFAULT_PRESET = "24h";
export const RANGE_KEYS = ["range", "since", "until"];
const iso = (ms) => new Date(ms).toISOString();

const isCustom = (params) => params.range === "custom" || Boolean(params.since || params.until);

// The range in `params` as {since, until} (ISO-8601, "" when open) and its `preset`.
// A preset ends at the next whole minute.
export function resolveRange(params, now = Date.now()) {
  if (isCustom(params)) {
    return { since: params.since || "", until: params.until || "", preset: "custom" };
  }
  const preset = PRESETS[params.range] ? params.range : DEFAULT_PRESET;
  const [, span] = PRESETS[preset];
  const end = Math.ceil(now / MINUTE_MS) * MINUTE_MS; // whole minutes, as stacks are kept
  return { since: iso(end - span), until: iso(end), preset };
}

// The URL parameters that carry the range (for links between views).
export function rangeParams(params) {
  return Object.fromEntries(RANGE_KEYS.filter((k) => params[k]).map((k) => [k, params[k]]));
}

// A preset picker, plus from/to inputs for a custom range; `apply(values)` opens the view
// with the range's URL parameters replaced by `values`.
export function rangeControl(params, apply) {
  const { preset } = resolveRange(params);
  const choices = [...Object.entries(PRESETS).map(([k, [label]]) => [k, label]), ["custom", "custom…"]];
  const picker = el(
    "select",
    { id: "range", "aria-label": "time range" },
    choices.map(([value, label]) => el("option", { value }, label)),
  );
  picker.value = preset;
  const from = el("input", { id: "range-since", type: "datetime-local", value: toLocal(params.since) });
  const to = el("input", { id: "range-until", type: "datetime-local", value: toLocal(params.until) });
  const applyCustom = el("button", { id: "range-apply", type: "button" }, "Apply range");
  const custom = el("span", { class: "custom-range" }, "from ", from, " to ", to, " ", applyCustom);
  custom.hidden = preset !== "custom";
  picker.addEventListener("change", () => {
    if (picker.value === "custom") {
      const shown = resolveRange(params);
      from.value = toLocal(shown.since);
      to.value = toLocal(shown.until);
      custom.hidden = false;
    } else {
      apply({ range: picker.value });
    }
  });
  applyCustom.addEventListener("click", () => {
    const values = { range: "custom", since: toIso(from.value), until: toIso(to.value) };
    apply(Object.fromEntries(Object.entries(values).filter(([, v]) => v)));
  });
  return el("span", { class: "range" }, el("b", {}, "Time range "), picker, " ", custom);
}
