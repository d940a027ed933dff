// Filter forms: their values live in the URL hash (`#/view?k=v`), so every view is a link.
import { el, toIso, toLocal, ui } from "./common.js";
import { RANGE_KEYS, rangeControl, rangeParams } from "./timerange.js";

// fields: [[name, label, type, choices?]]; type "time" takes local time, keeps ISO-8601 UTC;
// a choice "" reads "(all)". Submitting keeps the view's time range.
export function filterForm(view, fields, params, button = "Apply") {
  const inputs = fields.map(([name, label, type, choices]) => {
    const id = `f-${name}`;
    let input;
    if (choices) {
      input = el("select", { id, name }, choices.map((c) => el("option", { value: c }, c || "(all)")));
      input.value = params[name] || choices[0];
    } else if (type === "time") {
      input = el("input", { id, name, type: "datetime-local", value: toLocal(params[name]) });
    } else {
      input = el("input", { id, name, type, value: params[name] || "", step: "any", size: 12 });
    }
    return [name, type, el("label", {}, `${label} `, input)];
  });
  const form = el(
    "form",
    {
      class: "filters",
      onsubmit: (event) => {
        event.preventDefault();
        const values = { ...rangeParams(params) };
        for (const [name, type] of inputs) {
          const value = form.elements[name].value.trim();
          if (value) values[name] = type === "time" ? toIso(value) : value;
        }
        go(view, values);
      },
    },
    inputs.map(([, , label]) => label),
    el("button", { type: "submit" }, button),
  );
  return form;
}

// The time range picker of a view: a new range keeps the other filters, back to page one.
export function rangeBar(view, params) {
  const rest = Object.fromEntries(
    Object.entries(params).filter(([k]) => !RANGE_KEYS.includes(k) && k !== "offset"),
  );
  return el(
    "div",
    { class: "toolbar" },
    rangeControl(params, (values) => go(view, { ...rest, ...values })),
  );
}

// Opens a view; `ui.view` stays null until it has rendered.
export function go(view, values = {}) {
  const query = new URLSearchParams(values).toString();
  ui.view = null;
  location.hash = `#/${view}${query ? `?${query}` : ""}`;
}
