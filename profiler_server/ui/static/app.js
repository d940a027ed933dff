// The router: `#/routes?...` (the landing page), `#/requests?...`, `#/request/<id>`, `#/flame?...`, `#/diff?...`. The menu's
// links carry the time range from view to view.
import { hideTooltip, LoginNeeded, setStatus, ui } from "./common.js";
import { diffView } from "./diff.js";
import { flameView } from "./flame.js";
import { loginView } from "./login.js";
import { requestView } from "./request.js";
import { requestsView } from "./requests.js";
import { routesView } from "./routes.js";
import { rangeParams } from "./timerange.js";

const views = {
  routes: routesView,
  requests: requestsView,
  request: (root, params, id) => requestView(root, id),
  flame: flameView,
  diff: diffView,
};
let redraw = null;

async function route() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const [name, ...rest] = (path || "routes").split("/");
  const view = views[name] ? name : "routes";
  const params = Object.fromEntries(new URLSearchParams(query || ""));
  const root = document.getElementById("view");
  const range = new URLSearchParams(rangeParams(params)).toString();
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.view === (view === "request" ? "requests" : view));
    if (view !== "request") link.href = `#/${link.dataset.view}${range ? `?${range}` : ""}`;
  }
  ui.view = null;
  redraw = null;
  hideTooltip();
  setStatus("loading…");
  try {
    redraw = await views[view](root, params, decodeURIComponent(rest.join("/")));
    setStatus("");
  } catch (error) {
    if (error instanceof LoginNeeded) {
      loginView(root, error.message, route);
      setStatus("");
      ui.view = "login";
      return;
    }
    setStatus(`error: ${error.message}`);
  }
  ui.view = view;
}

let resizing = 0;
window.addEventListener("resize", () => {
  clearTimeout(resizing);
  resizing = setTimeout(() => redraw?.(), 100);
});
window.addEventListener("hashchange", route);
route();
