// Service and route pickers filled from the stored requests of the range (`/api/services`);
// the route picker lists the routes of the service picked.
import { el, getJSON } from "./common.js";
import { filterForm } from "./form.js";

export async function loadServices(range) {
  const { services } = await getJSON("/api/services", { since: range.since, until: range.until });
  return services;
}

export function routesOf(services, service) {
  const routes = services.filter((s) => !service || s.service === service).flatMap((s) => s.routes);
  return [...new Set(routes)].sort();
}

// The filterForm fields of the two pickers ("" = all); a value in the URL but not in the
// data stays a choice, so a shared link still shows what it filters on.
export function pickerFields(services, params) {
  const keep = (list, value) => (value && !list.includes(value) ? [...list, value] : list);
  const names = services.map((s) => s.service);
  return [
    ["service", "service", "text", ["", ...keep(names, params.service)]],
    ["route", "route", "text", ["", ...keep(routesOf(services, params.service), params.route)]],
  ];
}

export function linkPickers(form, services) {
  const { service, route } = form.elements;
  service.addEventListener("change", () => {
    const choices = ["", ...routesOf(services, service.value)];
    route.replaceChildren(...choices.map((r) => el("option", { value: r }, r || "(all)")));
  });
}

// A form of just the two pickers (the aggregate views).
export function pickerForm(view, services, params, button = "Apply") {
  const form = filterForm(view, pickerFields(services, params), params, button);
  linkPickers(form, services);
  return form;
}
