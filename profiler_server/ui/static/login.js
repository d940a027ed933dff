// The login form, shown when the server asks for its read token. The server answers a
// right token with an HttpOnly cookie that stands for it on every later request, the
// export links' downloads included; the token itself is never kept in the page.
import { el } from "./common.js";

export function loginView(root, message, onDone) {
  const token = el("input", {
    id: "token",
    type: "password",
    name: "token",
    autocomplete: "current-password",
    required: true,
    size: 40,
  });
  const problem = el("p", { class: "warn", id: "login-error" });
  const form = el(
    "form",
    { class: "login", onsubmit: (event) => submit(event, token, problem, onDone) },
    el("h2", {}, "Log in"),
    el("p", { class: "hint" }, message),
    el("label", {}, "Read token ", token),
    " ",
    el("button", { type: "submit" }, "Log in"),
    problem,
  );
  root.replaceChildren(form);
  token.focus();
}

async function submit(event, token, problem, onDone) {
  event.preventDefault();
  problem.textContent = "";
  const response = await fetch("/api/login", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token: token.value }),
  });
  if (response.ok) {
    onDone();
    return;
  }
  const body = await response.json().catch(() => ({}));
  problem.textContent = body.error || response.statusText;
}
