// The "Executions and reminders" region of the session file panel: executions (paged on the
// server, newest first) with View logs, Terminal (tty executions) and Cancel execution, transfers with their per-file
// outcomes and Cancel transfer, reminders with Cancel reminder, child agents with Resume, and
// the inbox notices with their read marks.

import { api, href } from "./api.js";
import { AnsiStream } from "./ansi.js";
import { badge, bytes, h, keyedList, when } from "./dom.js";
import { ExecutionTerminal } from "./terminal.js";

const PAGE = 50;
const ACTIVE = ["queued", "running", "unknown"];
const ACTIVE_TRANSFER = ["queued", "running"];
const LOG_POLL_MS = 500;
// Whether a command waits for input is the runner's live observation, not a change of the
// record the change stream watches: the rows of active interactive executions ask for it.
const INPUT_POLL_MS = 2000;
const INPUT_POLL_ROWS = 20;

// R2 tenants: what the execution's cgroup measured (peak memory, CPU seconds).
function usageLine(e) {
  const parts = [];
  if (e.peak_memory_bytes !== null && e.peak_memory_bytes !== undefined) {
    parts.push(`peak memory ${bytes(e.peak_memory_bytes)}`);
  }
  if (e.cpu_seconds !== null && e.cpu_seconds !== undefined) {
    parts.push(`CPU ${e.cpu_seconds.toFixed(2)} s`);
  }
  return parts.length ? h("div", { class: "muted usage" }, parts.join(" · ")) : null;
}

function agentName(session, agentId) {
  return agentId === session.main_agent_id ? "main" : agentId;
}

export class ActivityPanel {
  constructor(session, onError) {
    this.session = session;
    this.agents = session.agents || [];
    this.onError = onError;
    this.executions = [];
    this.nextBefore = null;
    this.logs = null; // {execution, stop, kind: "logs" | "terminal"}
    this.inputPoll = null;
    this.build();
  }

  build() {
    const section = (id, title, ...content) => h(
      "section", { class: "sub", "aria-labelledby": id }, h("h4", { id }, title), ...content,
    );
    this.counts = h("p", { class: "counts", id: "execution-counts", "aria-live": "polite" });
    this.execRows = h("tbody", { id: "execution-rows" });
    this.more = h("button", { type: "button", id: "older", hidden: true, onclick: () => this.loadOlder() }, "Load older executions");
    this.logView = h("div", { class: "logs", id: "log-view", role: "region", "aria-labelledby": "log-title" });
    // The log view's own row, put directly under the execution's row (renderExecutions).
    this.logRow = h("tr", { class: "log-row", "data-keep": "" }, h("td", { colspan: "5" }, this.logView));
    this.transferRows = h("ul", { class: "plain", id: "transfer-list" });
    this.timerRows = h("ul", { class: "plain", id: "timer-list" });
    this.agentRows = h("ul", { class: "plain", id: "agent-list" });
    this.noticeRows = h("ul", { class: "plain", id: "notice-list" });
    this.el = h(
      "section",
      { class: "card activity", role: "region", "aria-label": "Executions and reminders" },
      h("h3", {}, "Executions & reminders"),
      section(
        "executions-title", "Executions",
        this.counts,
        h("div", { class: "scroll", tabindex: "0", role: "group", "aria-label": "Executions table" },
          h("table", { class: "grid", id: "execution-table" },
            h("colgroup", {}, ...["c-id", "c-state", "c-what", "c-times", "c-actions"].map((c) => h("col", { class: c }))),
            h("thead", {}, h("tr", {},
              ...["Execution", "State", "Command or script", "Times", "Actions"]
                .map((t) => h("th", { scope: "col" }, t)))),
            this.execRows)),
        this.more,
      ),
      section("transfers-title", "Transfers", this.transferRows),
      section("timers-title", "Reminders", this.timerRows),
      section("agents-title", "Child agents", this.agentRows),
      section("notices-title", "Inbox notices", this.noticeRows),
    );
  }

  async load(withExecutions = true) {
    await Promise.all([
      withExecutions ? this.loadExecutions() : null,
      this.loadTransfers(),
      this.loadTimers(),
      this.loadNotices(),
    ]);
    this.renderAgents();
  }

  async refresh(parts, session) {
    if (session) {
      this.session = session;
      this.agents = session.agents || [];
    }
    const jobs = [];
    if (parts.includes("executions")) jobs.push(this.loadExecutions());
    if (parts.includes("transfers")) jobs.push(this.loadTransfers());
    if (parts.includes("timers")) jobs.push(this.loadTimers());
    if (parts.includes("notices")) jobs.push(this.loadNotices());
    await Promise.all(jobs);
    if (parts.includes("agents") || parts.includes("session")) this.renderAgents();
  }

  // ---------------------------------------------------------------- executions

  async loadExecutions(prefetched = null) {
    // The newest page again (as many rows as are shown, up to 500); older rows stay.
    const limit = Math.min(500, Math.max(PAGE, this.executions.length));
    const page = prefetched ? await prefetched
      : await api(`/v1/sessions/${this.session.session_id}/executions`, { query: { limit } });
    const fresh = new Map(page.executions.map((e) => [e.execution_id, e]));
    const oldest = page.executions.length ? page.executions[page.executions.length - 1] : null;
    // Rows shown from older pages (or slid out of the newest page) stay below it.
    const older = this.executions.filter((e) => !fresh.has(e.execution_id) && oldest && e.created_at <= oldest.created_at);
    this.executions = [...page.executions, ...older];
    if (!older.length) this.nextBefore = page.next_before_seq;
    this.showCounts(page);
    this.renderExecutions();
    this.watchInput();
    // The first page on screen: what a 10,000-execution session must show within 1 s.
    if (!performance.getEntriesByName("shellyard-executions-shown").length) {
      performance.mark("shellyard-executions-shown");
    }
    if (this.logs) {
      const current = fresh.get(this.logs.execution.execution_id);
      if (current) this.logs.execution = current;
    }
  }

  async loadOlder() {
    if (this.nextBefore === null) return;
    const page = await api(`/v1/sessions/${this.session.session_id}/executions`, {
      query: { limit: PAGE, before_seq: this.nextBefore },
    });
    this.executions = [...this.executions, ...page.executions];
    this.nextBefore = page.next_before_seq;
    this.showCounts(page);
    this.renderExecutions();
  }

  showCounts(page) {
    const active = ACTIVE.reduce((n, s) => n + (page.counts[s] || 0), 0);
    const shown = Object.entries(page.counts).filter(([, n]) => n).map(([s, n]) => `${n} ${s}`).join(", ");
    this.counts.textContent = `${page.total} executions (${active} active${shown ? `: ${shown}` : ""}); showing ${this.executions.length}, newest first.`;
  }

  renderExecutions() {
    this.more.hidden = this.nextBefore === null;
    if (!this.executions.length) {
      this.execRows.replaceChildren(h("tr", {}, h("td", { colspan: "8", class: "muted" }, "No execution yet.")));
      return;
    }
    if (this.execRows.firstElementChild && !this.execRows.firstElementChild.dataset.key) this.execRows.replaceChildren();
    keyedList(this.execRows, this.executions, (e) => e.execution_id, (e) => this.executionRow(e));
    this.placeLogRow();
  }

  placeLogRow() {
    if (!this.logs) return;
    const row = this.execRows.querySelector(`tr[data-execution="${this.logs.execution.execution_id}"]`);
    if (row && row.nextElementSibling !== this.logRow) row.after(this.logRow);
    for (const kind of ["logs", "terminal"]) {
      for (const button of this.execRows.querySelectorAll(`[data-focus="${kind}"]`)) {
        button.setAttribute("aria-expanded", String(button.closest("tr") === row && this.logs.kind === kind));
      }
    }
  }

  // Every INPUT_POLL_MS while any shown execution is active and interactive: each such row's
  // view again, and the rows re-rendered when one started or stopped waiting for input.
  watchInput() {
    if (this.inputPoll !== null) return;
    const tick = async () => {
      this.inputPoll = null;
      const watched = this.executions.filter((e) => e.interactive && ACTIVE.includes(e.state)).slice(0, INPUT_POLL_ROWS);
      if (!watched.length || !this.el.isConnected) return;
      const fresh = await Promise.all(watched.map((e) => api(`/v1/executions/${e.execution_id}`, { agent: e.agent_id }).catch(() => e)));
      const byId = new Map(fresh.map((e) => [e.execution_id, e]));
      const changed = watched.some((e) => byId.get(e.execution_id).awaiting_input !== e.awaiting_input
        || byId.get(e.execution_id).state !== e.state);
      if (changed) {
        this.executions = this.executions.map((e) => byId.get(e.execution_id) || e);
        this.renderExecutions();
      }
      this.inputPoll = setTimeout(() => tick().catch(this.onError), INPUT_POLL_MS);
    };
    this.inputPoll = setTimeout(() => tick().catch(this.onError), INPUT_POLL_MS);
  }

  executionRow(e) {
    const id = e.execution_id;
    const active = ACTIVE.includes(e.state);
    const full = e.command !== null && e.command !== undefined ? e.command : `script ${e.script_path}`;
    const firstLine = full.split("\n")[0];
    const multi = full.includes("\n") || full.length > 60;
    const what = h("div", { class: "what" },
      h("code", { class: "command", title: full }, e.command !== null && e.command !== undefined ? firstLine : h("span", {}, "script ", e.script_path)));
    if (multi) {
      const fullBox = h("pre", { class: "command-full", id: `cmd-${id}`, hidden: true }, full);
      const toggle = h("button", {
        type: "button", class: "link", "aria-expanded": "false", "aria-controls": `cmd-${id}`,
        "data-focus": "command", "aria-label": `Full command of ${id}`,
        onclick: () => {
          const open = fullBox.hidden;
          fullBox.hidden = !open;
          toggle.setAttribute("aria-expanded", String(open));
          toggle.textContent = open ? "less" : "full";
        },
      }, "full");
      what.append(toggle, fullBox);
    }
    // Badges: what the row's state alone does not say (docs/web.md "Layout").
    const badges = [];
    if (e.read_only) badges.push(h("span", { class: "flag flag-readonly", title: "ran on a read-only view of the workspace" }, "read-only"));
    if (e.background) badges.push(h("span", { class: "flag" }, "background"));
    if (e.waiting_for) badges.push(h("span", { class: "flag flag-queued", title: `queued behind ${e.waiting_for}` }, `behind ${e.waiting_for}`));
    if (e.limit) badges.push(h("span", { class: "flag flag-limit", "data-limit": e.limit }, `limit: ${e.limit}`));
    if (e.environment_id) badges.push(h("span", { class: "flag flag-env", title: `environment ${e.environment_id}` }, `env r${e.environment_revision ?? "?"}`));
    if (e.was_unknown) badges.push(h("span", { class: "flag flag-unknown" }, "was unknown"));
    if (e.tty) badges.push(h("span", { class: "flag", title: "runs on a terminal" }, "terminal"));
    else if (e.interactive) badges.push(h("span", { class: "flag", title: "its stdin stays open for input" }, "stdin open"));
    if (e.awaiting_input && active) badges.push(h("span", { class: "flag flag-input", "data-awaiting-input": "", title: "the command is waiting for what you type" }, "waits for input"));
    const times = h("div", { class: "times" },
      h("div", {}, "created ", when(e.created_at)),
      e.finished_at ? h("div", {}, "finished ", when(e.finished_at)) : e.started_at ? h("div", {}, "started ", when(e.started_at)) : null);
    const open = this.logs && this.logs.execution.execution_id === id ? this.logs.kind : null;
    const actions = h("div", { class: "actions" },
      h("button", { type: "button", "data-focus": "logs", "aria-label": `View logs of ${id}`, "aria-expanded": String(open === "logs"), onclick: () => this.openLogs(e) }, "View logs"),
      e.tty ? h("button", { type: "button", "data-focus": "terminal", "aria-label": `Open terminal of ${id}`, "aria-expanded": String(open === "terminal"), onclick: () => this.openTerminal(e) }, "Terminal") : null,
      active ? h("button", { type: "button", class: "danger", "data-focus": "cancel", "aria-label": `Cancel execution ${id}`, onclick: (ev) => this.cancelExecution(e, ev.target) }, "Cancel") : null);
    const exit = e.exit_code === null || e.exit_code === undefined ? null : [" ", h("span", { class: "exit" }, `exit ${e.exit_code}`)];
    return h("tr", { class: `state-${e.state}`, "data-execution": id },
      h("td", { "data-label": "Execution" }, h("code", { class: "exec-id" }, id),
        h("div", { class: "muted small" }, `${e.runner_id} · ${agentName(this.session, e.agent_id)}`),
        badges.length ? h("div", { class: "badges" }, ...badges) : null),
      h("td", { "data-label": "State" }, badge(e.state), exit,
        e.cancel_requested && active ? h("div", { class: "muted" }, "cancel requested") : null,
        e.error ? h("div", { class: "error" }, e.error) : null,
        usageLine(e)),
      h("td", { "data-label": "Command or script" }, what),
      h("td", { "data-label": "Times" }, times),
      h("td", { "data-label": "Actions" }, actions));
  }

  async cancelExecution(e, button) {
    button.disabled = true;
    try {
      await api(`/v1/executions/${e.execution_id}/cancel`, { method: "POST", agent: e.agent_id });
      await this.loadExecutions();
    } catch (err) {
      button.disabled = false;
      this.onError(err);
    }
  }

  // ---------------------------------------------------------------- logs

  openLogs(e) {
    if (this.logs) this.logs.stop();
    const id = e.execution_id;
    const out = h("pre", { class: "text term", id: "log-stdout", tabindex: "0", role: "log", "aria-label": "stdout" });
    const err = h("pre", { class: "text term", id: "log-stderr", tabindex: "0", role: "log", "aria-label": "stderr" });
    const streams = { stdout: new AnsiStream(out), stderr: new AnsiStream(err) };
    const status = h("p", { id: "log-status", role: "status" });
    const close = h("button", { type: "button", "aria-label": "Close logs", onclick: () => this.closeLogs() }, "Close logs");
    const follow = h("input", { type: "checkbox", id: "log-follow", checked: true });
    const find = h("input", { type: "search", id: "log-search", placeholder: "Find in log" });
    const found = h("span", { id: "log-found", class: "muted", "aria-live": "polite" });
    const search = () => this.searchLog(find.value, [out, err], found);
    find.addEventListener("input", search);
    const link = (stream) => h("a", {
      class: "button", href: href(`/v1/sessions/${this.session.session_id}/executions/${id}/logs/${stream}`, { agent_id: e.agent_id }),
      "aria-label": `Download ${stream} of ${id} (the whole log)`,
    }, `Download ${stream}`);
    this.logView.replaceChildren(
      h("div", { class: "log-head" },
        h("h5", { id: "log-title" }, "Logs of ", h("code", {}, id)),
        h("label", { class: "inline" }, follow, " Follow"),
        h("label", { for: "log-search", class: "sr-only" }, "Find in log"), find, found,
        link("stdout"), link("stderr"), close),
      status, h("h6", {}, "stdout"), out, h("h6", {}, "stderr"), err);
    let stopped = false;
    const offsets = { stdout: 0, stderr: 0 };
    const logs = { execution: e, kind: "logs", stop: () => { stopped = true; } };
    this.logs = logs;
    this.renderExecutions();
    const step = async () => {
      if (stopped) return;
      let complete = true;
      let state = logs.execution.state;
      for (const [stream, pre] of [["stdout", out], ["stderr", err]]) {
        const part = await api(`/v1/executions/${id}/logs`, {
          agent: e.agent_id, query: { stream, offset: offsets[stream], limit: 65536 },
        });
        if (stopped) return;
        if (part.data) {
          streams[stream].write(part.data);
          if (follow.checked) pre.scrollTop = pre.scrollHeight;
        }
        offsets[stream] = part.next_offset;
        complete = complete && part.complete;
        state = part.state;
      }
      if (find.value) search();
      const following = !complete || ACTIVE.includes(state);
      status.textContent = following ? `${state}: following the output…` : `${state}: all output shown.`;
      if (following) setTimeout(() => step().catch(this.onError), LOG_POLL_MS);
    };
    step().catch(this.onError);
    close.focus();
  }

  // The execution's terminal in the log view's row: its output live, what is typed sent.
  openTerminal(e) {
    if (this.logs) this.logs.stop();
    const id = e.execution_id;
    const terminal = new ExecutionTerminal(e, (state) => {
      if (this.logs === logs) logs.execution = { ...logs.execution, state };
    }, this.onError);
    const close = h("button", { type: "button", "aria-label": "Close terminal", onclick: () => this.closeLogs() }, "Close terminal");
    this.logView.replaceChildren(
      h("div", { class: "log-head" }, h("h5", { id: "log-title" }, "Terminal of ", h("code", {}, id)), close),
      terminal.el);
    const logs = { execution: e, kind: "terminal", stop: () => terminal.stop() };
    this.logs = logs;
    this.renderExecutions();
    terminal.start().catch(this.onError);
  }

  // Marks every match of ``query`` in the shown output (text nodes split around it).
  searchLog(query, pres, found) {
    for (const pre of pres) {
      for (const mark of [...pre.querySelectorAll("mark")]) mark.replaceWith(...mark.childNodes);
      pre.normalize();
    }
    if (!query) { found.textContent = ""; return; }
    let count = 0;
    const needle = query.toLowerCase();
    for (const pre of pres) {
      const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
      const nodes = [];
      while (walker.nextNode()) nodes.push(walker.currentNode);
      for (let node of nodes) {
        let at = node.data.toLowerCase().indexOf(needle);
        while (at >= 0 && count < 1000) {
          const match = node.splitText(at);
          node = match.splitText(needle.length);
          const mark = document.createElement("mark");
          match.replaceWith(mark);
          mark.append(match);
          count += 1;
          at = node.data.toLowerCase().indexOf(needle);
        }
      }
    }
    found.textContent = count ? `${count}${count >= 1000 ? "+" : ""} found` : "not found";
    const first = pres.map((p) => p.querySelector("mark")).find(Boolean);
    if (first) first.scrollIntoView({ block: "nearest" });
  }

  closeLogs() {
    const id = this.logs ? this.logs.execution.execution_id : null;
    const kind = this.logs ? this.logs.kind : "logs";
    if (this.logs) this.logs.stop();
    this.logs = null;
    this.logRow.remove();
    this.logView.replaceChildren();
    this.renderExecutions();
    const back = id && this.execRows.querySelector(`tr[data-execution="${id}"] [data-focus="${kind}"]`);
    if (back) back.focus();
  }

  // ---------------------------------------------------------------- transfers

  async loadTransfers() {
    const found = await api(`/v1/sessions/${this.session.session_id}/transfers`);
    if (!found.length) {
      this.transferRows.replaceChildren(h("li", { class: "muted" }, "No transfer."));
      return;
    }
    if (this.transferRows.firstElementChild && !this.transferRows.firstElementChild.dataset.key) this.transferRows.replaceChildren();
    keyedList(this.transferRows, found, (t) => t.transfer_id, (t) => this.transferItem(t));
  }

  transferItem(t) {
    const id = t.transfer_id;
    // T3: a file counts once it is in a committed target snapshot (copied, or already there).
    const committed = t.files_copied + t.files_unchanged;
    const files = h("div", { class: "transfer-files", id: `files-${id}` });
    const active = ACTIVE_TRANSFER.includes(t.state);
    return h("li", { class: "item", "data-transfer": id },
      h("div", {}, h("code", {}, id), " ", badge(t.state)),
      h("div", {}, h("code", {}, t.source_workspace_id), t.source_seq !== null ? ` @ #${t.source_seq}` : "", " → ",
        h("code", {}, t.target_workspace_id), ` /${t.target_folder}`),
      h("div", { class: "progress-text" }, `${committed}/${t.files_total} files committed`,
        ` (${t.files_copied} copied, ${t.files_unchanged} unchanged, ${t.files_skipped} skipped, ${t.files_failed} failed)`,
        ` · ${bytes(t.bytes_done)} of ${bytes(t.bytes_total)}`),
      h("progress", { max: String(Math.max(1, t.files_total)), value: String(committed), "aria-label": `Files committed of transfer ${id}` }),
      t.error ? h("div", { class: "error" }, t.error) : null,
      h("div", { class: "actions" },
        h("button", { type: "button", "data-focus": "files", "aria-label": `Show files of transfer ${id}`, onclick: () => this.showTransferFiles(t, files) }, "Show files"),
        active ? h("button", { type: "button", class: "danger", "data-focus": "cancel", "aria-label": `Cancel transfer ${id}`, onclick: (ev) => this.cancelTransfer(t, ev.target) }, "Cancel transfer") : null),
      files);
  }

  async showTransferFiles(t, box) {
    const page = await api(`/v1/transfers/${t.transfer_id}/files`, { agent: t.agent_id, query: { limit: 200 } });
    box.replaceChildren(h("ul", { class: "plain files-list" }, ...page.files.map((f) => h("li", {},
      h("span", { class: `badge badge-${f.outcome}` }, f.outcome), " ", h("code", {}, f.source_path), " → ",
      h("code", {}, f.target_path), ` · ${bytes(f.size)}`, f.reason ? h("span", { class: "error" }, ` (${f.reason})`) : null))),
    ...(page.next_offset !== null ? [h("p", { class: "muted" }, "First 200 files shown.")] : []));
  }

  async cancelTransfer(t, button) {
    button.disabled = true;
    try {
      await api(`/v1/transfers/${t.transfer_id}/cancel`, { method: "POST", agent: t.agent_id });
      await this.loadTransfers();
    } catch (err) {
      button.disabled = false;
      this.onError(err);
    }
  }

  // ---------------------------------------------------------------- reminders

  async loadTimers() {
    const found = await api(`/v1/sessions/${this.session.session_id}/timers`);
    if (!found.length) {
      this.timerRows.replaceChildren(h("li", { class: "muted" }, "No reminder."));
      return;
    }
    if (this.timerRows.firstElementChild && !this.timerRows.firstElementChild.dataset.key) this.timerRows.replaceChildren();
    keyedList(this.timerRows, found, (t) => t.timer_id, (t) => {
      const spec = Object.entries(t.spec).map(([k, v]) => `${k}: ${v}`).join(", ");
      return h("li", { class: "item", "data-timer": t.timer_id },
        h("div", {}, h("strong", {}, t.text)),
        h("div", {}, badge(t.state), t.late ? " late" : "", " due ", when(t.fire_at), h("span", { class: "muted" }, ` (asked as ${spec})`)),
        t.execution_id ? h("div", {}, "names execution ", h("code", {}, t.execution_id)) : null,
        t.cancel_reason ? h("div", { class: "muted" }, t.cancel_reason) : null,
        t.state === "pending" ? h("div", { class: "actions" }, h("button", {
          type: "button", class: "danger", "data-focus": "cancel", "aria-label": `Cancel reminder ${t.timer_id}`,
          onclick: (ev) => this.cancelTimer(t, ev.target),
        }, "Cancel reminder")) : null);
    });
  }

  async cancelTimer(t, button) {
    button.disabled = true;
    try {
      await api(`/v1/timers/${t.timer_id}/cancel`, { method: "POST", agent: t.agent_id });
      await this.loadTimers();
    } catch (err) {
      button.disabled = false;
      this.onError(err);
    }
  }

  // ---------------------------------------------------------------- agents, notices

  renderAgents() {
    const children = this.agents.filter((a) => !a.is_main);
    if (!children.length) {
      this.agentRows.replaceChildren(h("li", { class: "muted" }, "No child agent."));
      return;
    }
    if (this.agentRows.firstElementChild && !this.agentRows.firstElementChild.dataset.key) this.agentRows.replaceChildren();
    keyedList(this.agentRows, children, (a) => a.agent_id, (a) => {
      const message = h("p", { class: "error", role: "alert", id: `resume-error-${a.agent_id}` });
      return h("li", { class: "item", "data-agent": a.agent_id },
        h("code", {}, a.agent_id), " ", badge(a.state), " ",
        h("span", { class: `badge badge-gate-${a.gate}` }, a.gate === "closed" ? "stopped" : "gate open"),
        a.parent_id && a.parent_id !== this.session.main_agent_id ? h("span", { class: "muted" }, ` child of ${a.parent_id}`) : null,
        a.gate === "closed" ? h("div", { class: "actions" }, h("button", {
          type: "button", "data-focus": "resume", "aria-label": `Resume agent ${a.agent_id}`,
          onclick: (ev) => this.resume(a, ev.target, message),
        }, "Resume")) : null,
        message);
    });
  }

  async resume(agent, button, message) {
    button.disabled = true;
    message.textContent = "";
    try {
      const fresh = await api(`/v1/agents/${agent.agent_id}/resume`, { method: "POST" });
      this.agents = this.agents.map((a) => (a.agent_id === fresh.agent_id ? fresh : a));
      this.renderAgents();
    } catch (err) {
      button.disabled = false;
      message.textContent = `The server refused: ${err.message}`;
    }
  }

  async loadNotices() {
    const found = await api(`/v1/sessions/${this.session.session_id}/notices`);
    if (!found.length) {
      this.noticeRows.replaceChildren(h("li", { class: "muted" }, "No notice."));
      return;
    }
    if (this.noticeRows.firstElementChild && !this.noticeRows.firstElementChild.dataset.key) this.noticeRows.replaceChildren();
    keyedList(this.noticeRows, found, (n) => n.notice_id, (n) => h(
      "li", { class: `item notice ${n.read_at ? "read" : "unread"}`, "data-notice": n.notice_id },
      h("span", { class: `badge ${n.read_at ? "badge-read" : "badge-unread"}` }, n.read_at ? "read" : "unread"), " ",
      h("span", { class: "muted" }, `${n.kind} · ${agentName(this.session, n.agent_id)} · `), when(n.created_at),
      h("div", {}, n.summary)));
  }
}
