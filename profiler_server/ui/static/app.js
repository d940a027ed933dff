// The router: `#/requests?...`, `#/request/<id>`, `#/flame?...`, `#/diff?...`.
import { hideTooltip, setStatus, ui } from "./common.js";
import { diffView } from "./diff.js";
import { flameView } from "./flame.js";
import { requestView } from "./request.js";
import { requestsView } from "./requests.js";

const views = {
  requests: requestsView,
  request: (root, params, id) => requestView(root, id),
  flame: flameView,
  diff: diffView,
};
let redraw = null;

async function route() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const [name, ...rest] = (path || "requests").split("/");
  const view = views[name] ? name : "requests";
  const params = Object.fromEntries(new URLSearchParams(query || ""));
  const root = document.getElementById("view");
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.view === (view === "request" ? "requests" : view));
  }
  ui.view = null;
  redraw = null;
  hideTooltip();
  setStatus("loading…");
  try {
    redraw = await views[view](root, params, decodeURIComponent(rest.join("/")));
    setStatus("");
  } catch (error) {
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
