// Terminal output as the terminal shows it (docs/web.md "Logs"): ANSI SGR colours and styles
// become spans with classes (16 colours, themed for contrast) or inline colours (256 and
// 24-bit), a carriage return moves back to the line's start so progress lines collapse to
// what was last drawn, ESC[K erases to the line's end; every other escape is dropped, never
// shown. Text is only ever put in text nodes. It is fed chunk by chunk: an escape split
// across two chunks waits for the rest, the unfinished last line is redrawn in place.

const ESC = "\u001b";

function xterm256(n) {
  if (n < 16) return null; // the 16 named colours: classes
  if (n >= 232) {
    const v = 8 + (n - 232) * 10;
    return `rgb(${v}, ${v}, ${v})`;
  }
  const i = n - 16;
  const level = (c) => (c === 0 ? 0 : 55 + c * 40);
  return `rgb(${level(Math.floor(i / 36))}, ${level(Math.floor(i / 6) % 6)}, ${level(i % 6)})`;
}

const PLAIN = Object.freeze({ fg: null, bg: null, bold: false, dim: false, italic: false, underline: false, inverse: false, strike: false });

// The style after the SGR parameters ``params`` (numbers) applied to ``style``.
export function applySgr(style, params) {
  const s = { ...style };
  const list = params.length ? params : [0];
  for (let i = 0; i < list.length; i += 1) {
    const p = list[i];
    if (p === 0) Object.assign(s, PLAIN);
    else if (p === 1) s.bold = true;
    else if (p === 2) s.dim = true;
    else if (p === 3) s.italic = true;
    else if (p === 4) s.underline = true;
    else if (p === 7) s.inverse = true;
    else if (p === 9) s.strike = true;
    else if (p === 22) { s.bold = false; s.dim = false; }
    else if (p === 23) s.italic = false;
    else if (p === 24) s.underline = false;
    else if (p === 27) s.inverse = false;
    else if (p === 29) s.strike = false;
    else if (p >= 30 && p <= 37) s.fg = p - 30;
    else if (p >= 90 && p <= 97) s.fg = p - 90 + 8;
    else if (p === 39) s.fg = null;
    else if (p >= 40 && p <= 47) s.bg = p - 40;
    else if (p >= 100 && p <= 107) s.bg = p - 100 + 8;
    else if (p === 49) s.bg = null;
    else if (p === 38 || p === 48) {
      let colour = null;
      if (list[i + 1] === 5 && list[i + 2] !== undefined) {
        const n = list[i + 2];
        colour = xterm256(n) ?? n;
        i += 2;
      } else if (list[i + 1] === 2 && list[i + 4] !== undefined) {
        const [r, g, b] = list.slice(i + 2, i + 5).map((v) => Math.max(0, Math.min(255, v)));
        colour = `rgb(${r}, ${g}, ${b})`;
        i += 4;
      } else {
        break; // malformed: ignore the rest
      }
      if (p === 38) s.fg = colour;
      else s.bg = colour;
    }
  }
  return s;
}

function styleKey(s) {
  return JSON.stringify(s);
}

// A line's cells (one character each, with its style) as spans of equal style.
function spans(cells) {
  const out = [];
  let run = "";
  let style = null;
  const flush = () => {
    if (!run) return;
    out.push(span(run, style));
    run = "";
  };
  for (const cell of cells) {
    if (cell === undefined) { // a gap a cursor move left: a space
      if (style !== PLAIN) { flush(); style = PLAIN; }
      run += " ";
      continue;
    }
    if (style === null || styleKey(style) !== styleKey(cell.style)) {
      flush();
      style = cell.style;
    }
    run += cell.ch;
  }
  flush();
  return out;
}

function span(text, s) {
  if (!s || styleKey(s) === styleKey(PLAIN)) return document.createTextNode(text);
  const el = document.createElement("span");
  const classes = [];
  let fg = s.fg;
  let bg = s.bg;
  if (s.inverse) { [fg, bg] = [bg ?? "default-bg", fg ?? "default-fg"]; }
  if (typeof fg === "number") classes.push(`ansi-fg-${fg}`);
  else if (fg === "default-fg") classes.push("ansi-fg-default");
  else if (fg === "default-bg") classes.push("ansi-fg-inverse");
  else if (fg) el.style.color = fg;
  if (typeof bg === "number") classes.push(`ansi-bg-${bg}`);
  else if (bg === "default-fg") classes.push("ansi-bg-inverse");
  else if (bg) el.style.backgroundColor = bg;
  for (const flag of ["bold", "dim", "italic", "underline", "strike"]) if (s[flag]) classes.push(`ansi-${flag}`);
  el.className = classes.join(" ");
  el.textContent = text;
  return el;
}

// A converter for one stream, writing into ``target`` (a <pre>).
export class AnsiStream {
  constructor(target) {
    this.target = target;
    this.style = PLAIN;
    this.cells = []; // the unfinished line
    this.col = 0;
    this.pending = ""; // an escape not finished in the last chunk
    this.live = null; // the element showing the unfinished line
    this.text = ""; // the plain text shown so far (for search)
    this.lines = 0;
  }

  write(chunk) {
    let data = this.pending + chunk;
    this.pending = "";
    const done = document.createDocumentFragment();
    let i = 0;
    while (i < data.length) {
      const ch = data[i];
      if (ch === ESC) {
        const rest = data.slice(i);
        // CSI: ESC [ params intermediates final; OSC: ESC ] … BEL or ESC \
        if (rest.length < 2) { this.pending = rest; break; }
        if (rest[1] === "[") {
          const m = /^\u001b\[([0-?]*)([ -/]*)([@-~])/.exec(rest);
          if (!m) {
            if (/^\u001b\[[0-?]*[ -/]*$/.test(rest)) { this.pending = rest; break; }
            i += 2; // not a CSI after all: drop the ESC [
            continue;
          }
          this.csi(m[1], m[3]);
          i += m[0].length;
          continue;
        }
        if (rest[1] === "]") {
          const end = rest.search(/\u0007|\u001b\\/);
          if (end < 0) { this.pending = rest.length > 4096 ? "" : rest; break; }
          i += end + (rest[end] === "\u0007" ? 1 : 2);
          continue;
        }
        i += 2; // any other two-character escape
        continue;
      }
      if (ch === "\n") {
        done.append(...spans(this.cells), "\n");
        this.text += this.cells.map((c) => (c ? c.ch : " ")).join("") + "\n";
        this.lines += 1;
        this.cells = [];
        this.col = 0;
      } else if (ch === "\r") {
        this.col = 0;
      } else if (ch === "\b") {
        this.col = Math.max(0, this.col - 1);
      } else if (ch === "\t") {
        const next = (Math.floor(this.col / 8) + 1) * 8;
        while (this.col < next) this.put(" ");
      } else if (ch < " " && ch !== "\t") {
        // other controls (BEL …): not shown
      } else {
        this.put(ch);
      }
      i += 1;
    }
    if (this.live) this.live.remove();
    this.target.append(done);
    this.live = document.createElement("span");
    this.live.className = "ansi-live";
    this.live.append(...spans(this.cells));
    this.target.append(this.live);
  }

  put(ch) {
    this.cells[this.col] = { ch, style: this.style };
    this.col += 1;
  }

  csi(params, final) {
    if (final === "m") {
      const nums = params === "" ? [] : params.split(/[;:]/).map((p) => (p === "" ? 0 : Number(p)));
      if (nums.every((n) => Number.isFinite(n))) this.style = applySgr(this.style, nums);
    } else if (final === "K") {
      const mode = Number(params || 0);
      if (mode === 0) this.cells.length = Math.min(this.cells.length, this.col);
      else if (mode === 2) this.cells = [];
      else if (mode === 1) for (let c = 0; c < this.col; c += 1) this.cells[c] = undefined;
    } else if (final === "G") {
      this.col = Math.max(0, Number(params || 1) - 1);
    } else if (final === "D") {
      this.col = Math.max(0, this.col - Number(params || 1));
    } else if (final === "C") {
      this.col += Number(params || 1);
    }
    // cursor up/down, screen clears and modes: not a log's business, dropped
  }

  // The plain text (no escapes), finished lines and the current one.
  plain() {
    return this.text + this.cells.map((c) => (c ? c.ch : " ")).join("");
  }
}

// The whole of ``text`` converted into ``target`` (for tests and one-shot views).
export function renderAnsi(target, text) {
  const stream = new AnsiStream(target);
  stream.write(text);
  return stream;
}
