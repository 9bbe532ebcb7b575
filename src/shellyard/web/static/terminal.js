// The terminal of an execution run with tty=true (E13, docs/web.md "Terminal"): xterm.js,
// shipped in the package from its npm release (static/vendor/xterm/), shows the terminal's
// raw output read from the stdout log by byte offset (base64: the exact bytes, escapes and
// all), and what is typed into it goes to the execution's input route in order. xterm.js
// (345 KB) is imported when the first terminal opens, not with the page.

import { api } from "./api.js";
import { h } from "./dom.js";

const ACTIVE = ["queued", "running", "unknown"];
// A quiet terminal is read again after FAST_POLL_MS, growing to SLOW_POLL_MS; a typed key
// reads it at once, so its echo shows within one round trip.
const FAST_POLL_MS = 50;
const SLOW_POLL_MS = 500;
const PAGE = 65536;
const SEND_MAX = 16384;
// A longer log is not replayed from its first byte: the screen as it is now is drawn instead.
const REPLAY_MAX = 1 << 20;

function decode(base64) {
  const text = atob(base64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i += 1) bytes[i] = text.charCodeAt(i);
  return bytes;
}

// xterm.js writes its cell metrics and colours into <style> elements of its own, which the
// page's Content-Security-Policy (style-src 'self') rightly does not apply. Their text is
// mirrored into one constructed stylesheet, which that policy allows, so the policy stays as
// strict as it is.
function adoptStyles(root) {
  const sheet = new CSSStyleSheet();
  document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
  const copy = () => sheet.replaceSync(
    [...root.querySelectorAll("style")].map((s) => s.textContent).join("\n"));
  const touchesStyle = (record) => record.target.nodeName === "STYLE"
    || [...record.addedNodes].some((n) => n.nodeName === "STYLE");
  const observer = new MutationObserver((records) => { if (records.some(touchesStyle)) copy(); });
  observer.observe(root, { childList: true, subtree: true, characterData: true });
  copy();
  return () => {
    observer.disconnect();
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== sheet);
  };
}

export class ExecutionTerminal {
  // ``onState(view-like)`` is told the state the log pages report; ``onError`` any failure.
  constructor(execution, onState, onError) {
    this.execution = execution;
    this.onState = onState;
    this.onError = onError;
    this.offset = 0;
    this.stopped = false;
    this.timer = null;
    this.pause = FAST_POLL_MS;
    this.pending = "";
    this.sending = null;
    this.box = h("div", { class: "terminal", id: "terminal", role: "group", "aria-label": `Terminal of ${execution.execution_id}` });
    this.status = h("p", { id: "terminal-status", role: "status" });
    this.el = h("div", {}, this.status, this.box);
  }

  get path() {
    return `/v1/executions/${this.execution.execution_id}`;
  }

  async start() {
    const agent = this.execution.agent_id;
    const { Terminal } = await import("./vendor/xterm/xterm.mjs");
    if (this.stopped) return;
    const screen = await api(`${this.path}/screen`, { agent }).catch(() => null);
    if (this.stopped) return;
    this.term = new Terminal({
      rows: (screen && screen.rows) || this.execution.tty_rows || 24,
      cols: (screen && screen.cols) || this.execution.tty_cols || 80,
      scrollback: 5000,
      fontFamily: "ui-monospace, Menlo, Consolas, monospace",
      fontSize: 14,
    });
    this.unadopt = adoptStyles(this.box);
    this.term.open(this.box);
    this.term.onData((data) => this.send(data));
    const first = await api(`${this.path}/logs`, { agent, query: { stream: "stdout", offset: 0, limit: 1 } });
    if (first.size > REPLAY_MAX && screen) {
      // Only the present screen; the output goes on from the log's end.
      this.term.write(screen.text.split("\n").join("\r\n"));
      this.term.write(`\x1b[${screen.cursor.row + 1};${screen.cursor.col + 1}H`);
      this.offset = first.size;
    }
    await this.step();
    this.term.focus();
  }

  // Typed data is sent in order: while one request is on its way, what is typed meanwhile
  // waits and goes in the next.
  send(data) {
    if (this.stopped || !ACTIVE.includes(this.execution.state)) return;
    this.pending += data;
    if (this.sending) return;
    const flush = async () => {
      while (this.pending && !this.stopped) {
        // One request stays under the server's 64 KiB a call (a paste goes in parts); a
        // surrogate pair is never cut.
        let cut = Math.min(this.pending.length, SEND_MAX);
        if (cut < this.pending.length && /[\ud800-\udbff]/.test(this.pending[cut - 1])) cut -= 1;
        const text = this.pending.slice(0, cut);
        this.pending = this.pending.slice(cut);
        await api(`${this.path}/input`, { method: "POST", agent: this.execution.agent_id, body: { text } });
        this.kick();
      }
    };
    this.sending = flush().catch(this.onError).finally(() => { this.sending = null; });
  }

  kick() {
    this.pause = FAST_POLL_MS;
    if (this.timer !== null && !this.reading) {
      clearTimeout(this.timer);
      this.timer = null;
      this.step().catch(this.onError);
    }
  }

  async step() {
    if (this.stopped) return;
    this.timer = null;
    this.reading = true;
    let part;
    try {
      part = await api(`${this.path}/logs`, {
        agent: this.execution.agent_id,
        query: { stream: "stdout", offset: this.offset, limit: PAGE, encoding: "base64" },
      });
    } finally {
      this.reading = false;
    }
    if (this.stopped) return;
    if (part.data) this.term.write(decode(part.data));
    this.offset = part.next_offset;
    this.execution = { ...this.execution, state: part.state };
    this.onState(part.state);
    const going = !part.complete || ACTIVE.includes(part.state);
    this.status.textContent = going
      ? `${part.state}: type into the terminal to send input.`
      : `${part.state}: the command has ended.`;
    if (!going) {
      this.term.options.disableStdin = true;
      return;
    }
    this.pause = part.data ? FAST_POLL_MS : Math.min(SLOW_POLL_MS, this.pause * 2);
    this.timer = setTimeout(() => this.step().catch(this.onError), part.data ? 0 : this.pause);
  }

  focus() {
    if (this.term) this.term.focus();
  }

  stop() {
    this.stopped = true;
    if (this.timer !== null) clearTimeout(this.timer);
    if (this.term) this.term.dispose();
    if (this.unadopt) this.unadopt();
  }
}
