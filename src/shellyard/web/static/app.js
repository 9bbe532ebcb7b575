// The page: login (a one-time code from `shellyard ui` in the URL fragment, or a token typed
// into the form), the sessions list, and one session's file panel, kept live by the server's
// change stream (/v1/sessions/{id}/panel/stream).

import { ActivityPanel } from "./activity.js";
import { api, setCsrf } from "./api.js";
import { badge, h, keyedList, when } from "./dom.js";
import { FilePanel } from "./files.js";

const $ = (id) => document.getElementById(id);
const RECONNECT_MS = 1500;

const state = {
  me: null,
  sessions: [],
  current: null, // {session, files, activity, stream}
};

function fragment() {
  return new URLSearchParams(location.hash.replace(/^#/, ""));
}

function setFragment(values) {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(values)) if (value) params.set(key, value);
  const text = params.toString();
  history.replaceState(null, "", text ? `#${text}` : location.pathname);
}

function showError(err) {
  console.error(err);
  const box = $("panel-error");
  if (box) box.textContent = err && err.message ? err.message : String(err);
  if (err && err.status === 401) showLogin("Your login has ended: log in again.");
}

// ---------------------------------------------------------------- login

function showLogin(message) {
  closeSession();
  $("app").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "Not logged in: nothing of any session is shown.";
  $("login").hidden = false;
  $("login-error").textContent = message || "";
}

async function exchangeCode(code) {
  try {
    const me = await api("/v1/auth/login", { method: "POST", body: { code } });
    setCsrf(me.csrf);
    return me;
  } catch (err) {
    $("login-error").textContent = err.message;
    return null;
  }
}

async function whoAmI() {
  try {
    const me = await api("/v1/auth/me");
    setCsrf(me.csrf);
    return me;
  } catch (err) {
    if (err.status === 401) return null;
    throw err;
  }
}

// Resolves true when the user chooses to use the login link, false to keep ``current``.
function askToSwitch(current) {
  $("switch-text").textContent = `This page was opened with a login link. ${describe(current)}`;
  $("switch").hidden = false;
  return new Promise((resolve) => {
    const answer = (use) => () => {
      $("switch").hidden = true;
      resolve(use);
    };
    $("switch-use").addEventListener("click", answer(true), { once: true });
    $("switch-keep").addEventListener("click", answer(false), { once: true });
  });
}

function describe(me) {
  if (me.via === "none") return "No login needed (server runs without tokens).";
  if (me.kind === "admin") return "Logged in as admin: every session.";
  if (me.kind === "session") return `Logged in for session ${me.session_id}.`;
  return `Logged in as agent ${me.agent_id} of session ${me.session_id}.`;
}

async function loggedIn(me, wantedSession) {
  state.me = me;
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = me.via !== "cookie";
  $("who").textContent = describe(me);
  // The session named in the link: its newest executions are asked for at once, beside the
  // sessions list (one round trip less before the first paint).
  const early = wantedSession
    ? api(`/v1/sessions/${wantedSession}/executions`, { query: { limit: 50 } })
    : null;
  if (early) early.catch(() => null);
  await loadSessions();
  const pick = wantedSession || (state.sessions.length ? state.sessions[0].session_id : null);
  if (pick) await openSession(pick, pick === wantedSession ? early : null);
}

// ---------------------------------------------------------------- sessions

async function loadSessions() {
  state.sessions = await api("/v1/panel/sessions");
  const list = $("session-list");
  if (!state.sessions.length) {
    list.replaceChildren(h("li", { class: "muted" }, "No session."));
    return;
  }
  if (list.firstElementChild && !list.firstElementChild.dataset.key) list.replaceChildren();
  const currentId = state.current ? state.current.session.session_id : null;
  keyedList(list, state.sessions.map((s) => ({ ...s, current: s.session_id === currentId })),
    (s) => s.session_id, (s) => {
      const busy = s.agents.filter((a) => a.state === "busy").length;
      return h("li", {}, h("button", {
        type: "button",
        class: `session${s.current ? " current" : ""}`,
        "aria-current": s.current ? "page" : null,
        "data-focus": "open",
        onclick: () => openSession(s.session_id).catch(showError),
      },
      h("code", {}, s.session_id), s.is_default ? h("span", { class: "muted" }, " default") : null,
      h("div", {}, badge(s.state), ` ${s.agents.length} agent${s.agents.length === 1 ? "" : "s"}${busy ? `, ${busy} busy` : ""}`),
      h("div", { class: "muted" }, when(s.created_at))));
    });
}

function closeSession() {
  if (state.current && state.current.stream) state.current.stream.close();
  if (state.current && state.current.activity) state.current.activity.closeLogs();
  if (state.current) clearTimeout(state.current.retry);
  state.current = null;
}

async function openSession(sessionId, prefetched = null) {
  closeSession();
  const session = state.sessions.find((s) => s.session_id === sessionId);
  const panel = $("panel");
  if (!session) {
    panel.replaceChildren(h("p", { class: "error", role: "alert" }, `No session ${sessionId} that you can see.`));
    return;
  }
  setFragment({ session: sessionId });
  const files = new FilePanel(session, showError);
  const activity = new ActivityPanel(session, showError);
  const head = h("header", { class: "session-head" },
    h("h2", { id: "session-title" }, "Session ", h("code", {}, session.session_id)),
    h("span", { id: "session-state" }, badge(session.state)),
    h("span", { class: "muted", id: "session-agents" }, agentsText(session)));
  panel.replaceChildren(
    head,
    h("p", { id: "panel-error", class: "error", role: "alert" }),
    h("div", { class: "columns" }, activity.el, files.el),
  );
  state.current = { session, files, activity, stream: null, retry: null };
  for (const button of document.querySelectorAll("#session-list .session")) {
    const mine = button.closest("li").dataset.key === sessionId;
    button.classList.toggle("current", mine);
    if (mine) button.setAttribute("aria-current", "page");
    else button.removeAttribute("aria-current");
  }
  // The executions first: the server answers one request at a time on SQLite, and the
  // newest page of executions is what the panel is opened for.
  await activity.loadExecutions(prefetched).catch(showError);
  await Promise.all([files.load().catch(showError), activity.load(false).catch(showError)]);
  performance.mark("shellyard-first-paint");
  follow(state.current);
}

function agentsText(session) {
  const children = session.agents.filter((a) => !a.is_main).length;
  return ` main agent ${session.main_agent_id}${children ? `, ${children} child agent${children === 1 ? "" : "s"}` : ""}`;
}

// ---------------------------------------------------------------- live

function follow(current) {
  const sid = current.session.session_id;
  const live = $("live");
  const stream = new EventSource(`/v1/sessions/${sid}/panel/stream`);
  current.stream = stream;
  stream.addEventListener("open", () => { live.textContent = "Live"; live.className = "live on"; });
  stream.addEventListener("change", (event) => {
    if (state.current !== current) return;
    const change = JSON.parse(event.data);
    refresh(current, change.parts).catch(showError);
  });
  stream.addEventListener("error", () => {
    live.textContent = "Reconnecting…";
    live.className = "live off";
    // The browser retries by itself; after an HTTP error it gives up, so start again.
    if (stream.readyState === EventSource.CLOSED && state.current === current) {
      current.retry = setTimeout(() => {
        if (state.current !== current) return;
        whoAmI().then((me) => (me ? follow(current) : showLogin("Your login has ended: log in again.")))
          .catch(() => follow(current));
      }, RECONNECT_MS);
    }
  });
}

async function refresh(current, parts) {
  let session = null;
  if (parts.includes("session") || parts.includes("agents")) {
    await loadSessions();
    session = state.sessions.find((s) => s.session_id === current.session.session_id) || null;
    if (session) {
      current.session = session;
      $("session-state").replaceChildren(badge(session.state));
      $("session-agents").textContent = agentsText(session);
    }
  }
  await Promise.all([
    current.files.refresh(parts).catch(showError),
    current.activity.refresh(parts, session).catch(showError),
  ]);
  const box = $("panel-error");
  if (box && box.textContent.startsWith("the server cannot be reached")) box.textContent = "";
}

// ---------------------------------------------------------------- start

async function start() {
  $("login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = $("login-token").value.trim();
    try {
      const me = await api("/v1/auth/login", { method: "POST", body: { token } });
      setCsrf(me.csrf);
      $("login-token").value = "";
      await loggedIn(me, fragment().get("session"));
    } catch (err) {
      $("login-error").textContent = err.message;
    }
  });
  $("logout").addEventListener("click", async () => {
    try {
      await api("/v1/auth/logout", { method: "POST" });
    } finally {
      setCsrf(null);
      showLogin("Logged out.");
    }
  });
  const params = fragment();
  const code = params.get("login");
  const wanted = params.get("session");
  let me = null;
  if (code) {
    setFragment({ session: wanted }); // the code is spent: keep it out of the history
    // A login link replaces a login only when asked: any page (an agent's forwarded port
    // included) can send this browser here with a code of its own (docs/web.md, "Login").
    const current = await whoAmI();
    if (current && current.via !== "none" && !(await askToSwitch(current))) me = current;
    else me = await exchangeCode(code);
  }
  if (!me) me = await whoAmI();
  if (!me) {
    if (!code) showLogin();
    else { const msg = $("login-error").textContent; showLogin(msg); }
    return;
  }
  await loggedIn(me, wanted);
}

// A login link opened in a tab that shows the page already changes only the fragment: start
// again so that its code is used.
window.addEventListener("hashchange", () => {
  if (fragment().get("login")) location.reload();
});

start().catch(showError);
