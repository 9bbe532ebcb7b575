// The file part of the session file panel: a workspace's committed snapshots (W2): folders,
// a text preview, downloads of a file or a folder (tar), the snapshot picker (history with
// what made each snapshot), the diff of two snapshots, and the session's artifacts.

import { api, href } from "./api.js";
import { bytes, h, keyedList, when } from "./dom.js";
import { languageOf, showCode } from "./code.js";
import { renderMarkdown } from "./markdown.js";
import { diffLines, diffWords, hunks, parseDelimited } from "./textdiff.js";

const IMAGE = /\.(png|jpe?g|gif|webp|svg)$/i;
const CSV_ROWS = 200;
// Changed text files whose lines the diff shows (each read up to PREVIEW_BYTES per side).
const DIFF_FILES = 20;

const PREVIEW_BYTES = 65536;
// A PDF's first page is drawn from the whole file, read into the page: up to this size.
const PDF_BYTES = 32 * 1024 * 1024;

// A file's sha256 is null when the runner does not know it without hashing a sparse file's
// holes; its content id (equal content, equal id) is then what tells two versions apart.
function idLabel(when, sha256, contentId) {
  if (sha256) return ` · sha256 ${when} ${sha256.slice(0, 16)}…`;
  if (contentId) return ` · content id ${when} ${contentId.slice(0, 16)}…`;
  return "";
}

function baseName(path) {
  const parts = path.split("/").filter(Boolean);
  return parts.length ? parts[parts.length - 1] : "/";
}

export class FilePanel {
  constructor(session, onError) {
    this.session = session;
    this.onError = onError;
    this.workspaces = [];
    this.workspace = null; // a WorkspaceView
    this.history = null; // a HistoryView
    this.seq = null; // null: follow the head
    this.path = "";
    this.build();
  }

  build() {
    const sid = this.session.session_id;
    this.wsSelect = h("select", { id: "ws-select", onchange: () => this.pickWorkspace() });
    this.seqSelect = h("select", { id: "seq-select", onchange: () => this.pickSeq() });
    this.crumbs = h("nav", { class: "crumbs", "aria-label": "Folder path" });
    this.rows = h("tbody");
    this.preview = h("div", { class: "preview", id: "preview", "aria-live": "polite" });
    this.folderLink = h("a", { class: "button", id: "download-folder" }, "Download folder (tar)");
    this.fromSelect = h("select", { id: "diff-from" });
    this.toSelect = h("select", { id: "diff-to" });
    this.diffOut = h("div", { class: "diff", id: "diff-result", "aria-live": "polite" });
    this.artifactRows = h("ul", { class: "plain", id: "artifact-list" });
    this.el = h(
      "section",
      { class: "card files", "aria-labelledby": `files-title-${sid}` },
      h("h3", { id: `files-title-${sid}` }, "Files"),
      h(
        "div",
        { class: "controls" },
        h("label", { for: "ws-select" }, "Workspace"),
        this.wsSelect,
        h("label", { for: "seq-select" }, "Snapshot"),
        this.seqSelect,
        this.folderLink,
      ),
      this.crumbs,
      h(
        "div",
        { class: "scroll", tabindex: "0", role: "group", "aria-label": "Folder contents" },
        h(
          "table",
          { class: "grid", id: "file-table" },
          h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", {}, "Size"), h("th", {}, "Download"))),
          this.rows,
        ),
      ),
      this.preview,
      h("h4", {}, "Compare snapshots"),
      h(
        "form",
        { class: "controls", onsubmit: (event) => { event.preventDefault(); this.showDiff(); } },
        h("label", { for: "diff-from" }, "From snapshot"),
        this.fromSelect,
        h("label", { for: "diff-to" }, "To snapshot"),
        this.toSelect,
        h("button", { type: "submit" }, "Show diff"),
      ),
      this.diffOut,
      h("h4", {}, "Artifacts"),
      this.artifactRows,
    );
  }

  agent() {
    return this.workspace ? this.workspace.agent_id : undefined;
  }

  async load() {
    await Promise.all([this.loadWorkspaces(), this.loadArtifacts()]);
  }

  async refresh(parts) {
    if (parts.includes("files") || parts.includes("agents")) await this.loadWorkspaces();
    if (parts.includes("artifacts")) await this.loadArtifacts();
  }

  async loadWorkspaces() {
    const sid = this.session.session_id;
    this.workspaces = await api(`/v1/sessions/${sid}/workspaces`);
    const keep = this.workspace && this.workspaces.find((w) => w.workspace_id === this.workspace.workspace_id);
    const main = this.workspaces.find((w) => w.agent_id === this.session.main_agent_id && w.runner_id === "local");
    const previousHead = this.workspace ? this.workspace.head_seq : null;
    this.workspace = keep || main || this.workspaces[0] || null;
    this.wsSelect.replaceChildren(
      ...this.workspaces.map((w) => {
        const who = w.agent_id === this.session.main_agent_id ? "main agent" : `agent ${w.agent_id}`;
        return h("option", { value: w.workspace_id, selected: w === this.workspace },
          `${w.workspace_id} · ${w.runner_id} · ${who}`);
      }),
    );
    if (!this.workspace) {
      this.rows.replaceChildren(h("tr", {}, h("td", { colspan: "3", class: "muted" }, "No workspace yet.")));
      return;
    }
    if (!keep || previousHead !== this.workspace.head_seq || !this.history) {
      await this.loadHistory();
      if (this.seq === null) await this.loadListing();
    }
  }

  async loadHistory() {
    this.history = await api("/v1/files/history", {
      agent: this.agent(),
      query: { workspace_id: this.workspace.workspace_id },
    });
    const snaps = [...this.history.snapshots].reverse();
    const label = (s) => {
      const made = s.made_by_id ? `${s.made_by_kind} ${s.made_by_id}` : s.made_by_kind;
      const time = s.created_at ? new Date(s.created_at * 1000).toLocaleString() : "";
      const head = s.seq === this.history.head_seq ? " (head)" : "";
      const pruned = s.retained ? "" : " — pruned";
      return `#${s.seq}${head} — ${made}${time ? ` — ${time}` : ""}${pruned}`;
    };
    const options = (selected) => snaps.map((s) => h("option", {
      value: String(s.seq), selected: s.seq === selected, disabled: !s.retained,
    }, label(s)));
    this.seqSelect.replaceChildren(
      h("option", { value: "", selected: this.seq === null }, `Head (follows new snapshots, now #${this.history.head_seq})`),
      ...options(this.seq),
    );
    const to = this.history.head_seq;
    const from = snaps.length > 1 ? snaps[1].seq : to;
    this.toSelect.replaceChildren(...options(Number(this.toSelect.value || to)));
    this.fromSelect.replaceChildren(...options(Number(this.fromSelect.value || from)));
  }

  currentSeq() {
    return this.seq === null ? this.history.head_seq : this.seq;
  }

  pickWorkspace() {
    this.workspace = this.workspaces.find((w) => w.workspace_id === this.wsSelect.value) || null;
    this.seq = null;
    this.path = "";
    this.fromSelect.value = "";
    this.toSelect.value = "";
    this.loadHistory().then(() => this.loadListing()).catch(this.onError);
  }

  pickSeq() {
    this.seq = this.seqSelect.value === "" ? null : Number(this.seqSelect.value);
    this.loadListing().catch(this.onError);
  }

  open(path) {
    this.path = path;
    this.preview.replaceChildren();
    this.loadListing().catch(this.onError);
  }

  async loadListing() {
    if (!this.workspace || !this.history) return;
    const seq = this.currentSeq();
    const ws = this.workspace.workspace_id;
    const sid = this.session.session_id;
    let listing;
    try {
      listing = await api("/v1/files", {
        agent: this.agent(),
        query: { workspace_id: ws, seq, path: this.path, limit: 1000 },
      });
    } catch (err) {
      if (this.path && err.status === 404) { // the folder is gone in this snapshot
        this.path = "";
        return this.loadListing();
      }
      throw err;
    }
    const parts = this.path.split("/").filter(Boolean);
    this.crumbs.replaceChildren(
      h("button", { type: "button", class: "link", "aria-label": "Workspace root", onclick: () => this.open("") }, "/"),
      ...parts.map((part, i) => [
        h("span", { "aria-hidden": "true" }, " / "),
        h("button", { type: "button", class: "link", onclick: () => this.open(parts.slice(0, i + 1).join("/")) }, part),
      ]).flat(),
    );
    this.folderLink.setAttribute("href", href(`/v1/sessions/${sid}/files/archive`, { workspace_id: ws, seq, path: this.path }));
    this.folderLink.setAttribute("aria-label", `Download folder /${this.path} as tar`);
    const entries = [...listing.entries].sort((a, b) => (a.kind === "dir") === (b.kind === "dir")
      ? a.path.localeCompare(b.path) : a.kind === "dir" ? -1 : 1);
    if (!entries.length) {
      this.rows.replaceChildren(h("tr", {}, h("td", { colspan: "3", class: "muted" }, "This folder is empty.")));
      return;
    }
    keyedList(this.rows, entries.map((e) => ({ ...e, seq })), (e) => e.path, (e) => {
      const name = baseName(e.path);
      const isDir = e.kind === "dir";
      const open = isDir
        ? h("button", { type: "button", class: "link", "aria-label": `Open folder ${name}`, "data-focus": "open", onclick: () => this.open(e.path) }, `${name}/`)
        : h("button", { type: "button", class: "link", "aria-label": `Preview ${name}`, "data-focus": "open", onclick: () => this.showPreview(e) },
          e.kind === "symlink" ? `${name} → ${e.target}` : name);
      const link = isDir
        ? h("a", { href: href(`/v1/sessions/${sid}/files/archive`, { workspace_id: ws, seq, path: e.path }), "aria-label": `Download folder ${name} as tar` }, "tar")
        : e.kind === "file"
          ? h("a", { href: href(`/v1/sessions/${sid}/files/content`, { workspace_id: ws, seq, path: e.path }), "aria-label": `Download ${name}` }, "download")
          : "";
      return h("tr", {}, h("td", {}, open), h("td", {}, isDir ? "" : bytes(e.size)), h("td", {}, link));
    });
  }

  async showPreview(entry) {
    const seq = this.currentSeq();
    const ws = this.workspace.workspace_id;
    const sid = this.session.session_id;
    const name = baseName(entry.path);
    const title = h("h4", { id: "preview-title" }, `${entry.path} @ #${seq} — ${bytes(entry.size)}`);
    if (IMAGE.test(name)) {
      // Served by the preview route with its own type and a sandbox policy (docs/web.md).
      const img = h("img", {
        class: "preview-image", id: "preview-image", alt: `${name} at snapshot #${seq}`,
        src: href(`/v1/sessions/${sid}/files/preview`, { workspace_id: ws, seq, path: entry.path }),
      });
      this.preview.replaceChildren(title, img);
      return;
    }
    if (/\.pdf$/i.test(name)) {
      this.showPdf(title, entry, href(`/v1/sessions/${sid}/files/preview`, { workspace_id: ws, seq, path: entry.path }));
      return;
    }
    const text = await api("/v1/files/text", {
      agent: this.agent(),
      query: { workspace_id: ws, seq, path: entry.path, limit: PREVIEW_BYTES },
    });
    title.textContent = `${entry.path} @ #${seq} — ${bytes(text.size)}`;
    // Not text: not UTF-8, or a NUL byte in its first 8000 characters (git's rule).
    if (text.encoding !== "utf-8" || text.data.slice(0, 8000).includes("\u0000")) {
      this.preview.replaceChildren(title, h("p", { class: "muted" },
        `Not text (binary, ${bytes(text.size)}): use its download link.`));
      return;
    }
    const more = text.complete ? null : h("p", { class: "muted" }, `First ${bytes(text.next_offset)} shown; download the file for all of it.`);
    let body;
    if (/\.(csv|tsv)$/i.test(name)) body = this.csvTable(text.data, /\.tsv$/i.test(name) ? "\t" : ",", !text.complete);
    else if (/\.(md|markdown)$/i.test(name)) body = renderMarkdown(text.data);
    else if (/\.json$/i.test(name)) body = h("pre", { class: "text", tabindex: "0", role: "region", "aria-labelledby": "preview-title" }, prettyJson(text.data));
    else return this.showText(title, text, name, { workspace_id: ws, seq, path: entry.path });
    this.preview.replaceChildren(...[title, body, more].filter(Boolean));
  }

  // A PDF's first page, drawn by PDF.js in a frame sandboxed to an opaque origin
  // (pdfview.html): the parser runs where it can reach neither the panel nor the API. The
  // bytes go in by postMessage; the frame answers "drawn" (with the page count) or "error".
  showPdf(title, entry, source) {
    if (entry.size > PDF_BYTES) {
      this.preview.replaceChildren(title, h("p", { class: "muted" },
        `A PDF of ${bytes(entry.size)}: too large to preview here (${bytes(PDF_BYTES)}); use its download link.`));
      return;
    }
    const frame = h("iframe", {
      class: "preview-pdf", id: "preview-pdf", sandbox: "allow-scripts",
      src: "/ui/static/pdfview.html", title: `First page of ${entry.path}`,
    });
    const note = h("p", { class: "muted", id: "preview-pdf-note", role: "status" }, "Drawing the first page…");
    const listen = async (event) => {
      if (event.source !== frame.contentWindow || !event.data || !event.data.shellyardPdf) return;
      const said = event.data;
      if (said.shellyardPdf === "ready") {
        try {
          const response = await fetch(source, { credentials: "same-origin" });
          if (!response.ok) throw new Error(`the file could not be read (${response.status})`);
          const pdf = await response.arrayBuffer();
          frame.contentWindow.postMessage({ pdf, width: frame.clientWidth || 600 }, "*", [pdf]);
        } catch (err) {
          note.textContent = `Not shown: ${err.message}`;
        }
      } else if (said.shellyardPdf === "drawn") {
        frame.style.height = `${Math.min(said.height, 900) + 8}px`;
        note.textContent = `Page 1 of ${said.pages}; the download link has the whole file.`;
      } else {
        note.textContent = `Not shown (${said.message}): use its download link.`;
      }
    };
    window.addEventListener("message", listen);
    // Dropped with the preview: a later preview replaces the frame.
    new MutationObserver((_, observer) => {
      if (!frame.isConnected) {
        window.removeEventListener("message", listen);
        observer.disconnect();
      }
    }).observe(this.preview, { childList: true });
    this.preview.replaceChildren(title, frame, note);
  }

  // Plain text and code, in colour where the name tells the language; a large file is read
  // by ranges: the first PREVIEW_BYTES, then the next ones on demand (a button), from the
  // same committed snapshot.
  showText(title, first, name, where) {
    const language = languageOf(name);
    const pre = h("pre", { class: "text", id: "preview-text", tabindex: "0", role: "region", "aria-labelledby": "preview-title" });
    const shown = h("p", { class: "muted", id: "preview-shown", role: "status" });
    const next = h("button", { type: "button", id: "preview-more" }, `Show the next ${bytes(PREVIEW_BYTES)}`);
    let text = first.data;
    let part = first;
    const render = () => {
      showCode(pre, text, language);
      shown.textContent = part.complete
        ? (part.offset > 0 ? `All ${bytes(part.size)} shown.` : "")
        : `First ${bytes(part.next_offset)} of ${bytes(part.size)} shown.`;
      next.hidden = part.complete;
    };
    next.addEventListener("click", async () => {
      next.disabled = true;
      try {
        const page = await api("/v1/files/text", {
          agent: this.agent(),
          query: { ...where, offset: part.next_offset, limit: PREVIEW_BYTES },
        });
        if (page.encoding !== "utf-8") {
          shown.textContent = "The rest is not UTF-8 text: use the file's download link.";
          next.hidden = true;
          return;
        }
        text += page.data;
        part = page;
        render();
      } catch (err) {
        this.onError(err);
      } finally {
        next.disabled = false;
      }
    });
    render();
    this.preview.replaceChildren(title, pre, h("div", { class: "preview-range" }, shown, next));
  }

  csvTable(data, sep, cut) {
    const { rows, truncated } = parseDelimited(data, sep, CSV_ROWS + 1);
    if (!rows.length) return h("p", { class: "muted" }, "Empty table.");
    const [head, ...body] = rows;
    const shown = body.slice(0, CSV_ROWS);
    const note = truncated || cut || body.length > CSV_ROWS
      ? `First ${shown.length} rows shown; download the file for all of it.`
      : `${shown.length} rows.`;
    return h("div", {},
      h("p", { class: "muted", id: "csv-count" }, note),
      h("div", { class: "scroll", tabindex: "0", role: "group", "aria-label": "Table preview" },
        h("table", { class: "grid csv", id: "csv-table" },
          h("thead", {}, h("tr", {}, ...head.map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, ...shown.map((r) => h("tr", {}, ...r.map((c) => h("td", {}, c))))))));
  }

  async showDiff() {
    const from = Number(this.fromSelect.value);
    const to = Number(this.toSelect.value);
    const ws = this.workspace.workspace_id;
    const diff = await api("/v1/files/diff", {
      agent: this.agent(),
      query: { workspace_id: ws, from_seq: from, to_seq: to, limit: 1000 },
    });
    const title = h("h5", { id: "diff-title" }, `Changes from #${diff.from_seq} to #${diff.to_seq}: ${diff.changes.length}${diff.next_after ? "+" : ""}`);
    if (!diff.changes.length) {
      this.diffOut.replaceChildren(title, h("p", { class: "muted" }, "No change."));
      return;
    }
    const files = diff.changes.filter((c) => c.kind !== "dir");
    const blocks = await Promise.all(files.map((c, i) => this.changeBlock(c, diff, i < DIFF_FILES)));
    this.diffOut.replaceChildren(title, h("div", { "aria-labelledby": "diff-title" }, ...blocks));
  }

  async readSide(path, seq) {
    const text = await api("/v1/files/text", {
      agent: this.agent(),
      query: { workspace_id: this.workspace.workspace_id, seq, path, limit: PREVIEW_BYTES },
    });
    const binary = text.encoding !== "utf-8" || text.data.slice(0, 8000).includes("\u0000");
    return { text: text.data, complete: text.complete, binary, sha256: text.sha256 };
  }

  async changeBlock(c, diff, withLines) {
    const sid = this.session.session_id;
    const ws = this.workspace.workspace_id;
    const size = c.change === "changed" ? `${bytes(c.old_size)} → ${bytes(c.new_size)}`
      : bytes(c.change === "added" ? c.new_size : c.old_size);
    const head = h("div", { class: "change-head" },
      h("span", { class: `badge badge-${c.change}` }, c.change), " ",
      h("code", {}, c.path), " ", h("span", { class: "muted" }, size));
    const block = h("section", { class: `change change-${c.change}`, "aria-label": `${c.change} ${c.path}` }, head);
    if (IMAGE.test(c.path)) {
      const img = (seq, label) => h("figure", {}, h("img", {
        class: "preview-image", alt: `${c.path} at #${seq}`,
        src: href(`/v1/sessions/${sid}/files/preview`, { workspace_id: ws, seq, path: c.path }),
      }), h("figcaption", {}, label));
      block.append(h("div", { class: "side-by-side" },
        c.change !== "added" ? img(diff.from_seq, `before (#${diff.from_seq})`) : null,
        c.change !== "removed" ? img(diff.to_seq, `after (#${diff.to_seq})`) : null));
      return block;
    }
    if (!withLines) return block;
    try {
      const [before, after] = await Promise.all([
        c.change === "added" ? { text: "", complete: true, binary: false } : this.readSide(c.path, diff.from_seq),
        c.change === "removed" ? { text: "", complete: true, binary: false } : this.readSide(c.path, diff.to_seq),
      ]);
      if (before.binary || after.binary) {
        block.append(h("p", { class: "muted" }, `Binary: ${size}`,
          idLabel("before", c.old_sha256, c.old_content_id),
          idLabel("after", c.new_sha256, c.new_content_id)));
        return block;
      }
      const lines = (t) => (t === "" ? [] : t.replace(/\n$/, "").split("\n"));
      const ops = diffLines(lines(before.text), lines(after.text));
      if (!ops) {
        block.append(h("p", { class: "muted" }, "Too many changed lines to show: download both versions."));
        return block;
      }
      block.append(unified(hunks(ops)));
      if (!before.complete || !after.complete) block.append(h("p", { class: "muted" }, `Lines of the first ${bytes(PREVIEW_BYTES)} of each side compared.`));
    } catch (err) {
      block.append(h("p", { class: "error" }, `Lines not shown: ${err.message}`));
    }
    return block;
  }

  async loadArtifacts() {
    const sid = this.session.session_id;
    const found = await api(`/v1/sessions/${sid}/artifacts`);
    if (!found.length) {
      this.artifactRows.replaceChildren(h("li", { class: "muted" }, "No artifact declared."));
      return;
    }
    keyedList(this.artifactRows, found, (a) => a.artifact_id, (a) => h(
      "li", {},
      h("a", { href: href(`/v1/sessions/${sid}/artifacts/${a.artifact_id}/content`), "aria-label": `Download artifact ${a.name}` }, a.name),
      " ", h("span", { class: "muted" }, `${a.path} @ #${a.seq} · ${bytes(a.size)} · `), when(a.created_at),
    ));
  }
}

function prettyJson(data) {
  try {
    return JSON.stringify(JSON.parse(data), null, 2);
  } catch {
    return data; // not whole JSON (cut, or invalid): as it is
  }
}

// Unified hunks as a table: old and new line numbers, the sign, the line; the changed words
// of a removed line followed by an added one marked (<del>/<ins>).
function unified(list) {
  const rows = [];
  for (const hunk of list) {
    rows.push(h("tr", { class: "hunk" }, h("td", { colspan: "4" }, hunk.header)));
    const lines = hunk.lines;
    for (let i = 0; i < lines.length; i += 1) {
      const l = lines[i];
      let content = l.text;
      const pair = l.op === "-" && lines[i + 1] && lines[i + 1].op === "+" ? lines[i + 1]
        : l.op === "+" && lines[i - 1] && lines[i - 1].op === "-" ? lines[i - 1] : null;
      if (pair) {
        const words = l.op === "-" ? diffWords(l.text, pair.text).old : diffWords(pair.text, l.text).new;
        content = words.map(([t, changed]) => (changed ? h(l.op === "-" ? "del" : "ins", {}, t) : t));
      }
      const cls = l.op === "-" ? "line-removed" : l.op === "+" ? "line-added" : "line-same";
      rows.push(h("tr", { class: cls },
        h("td", { class: "ln" }, l.old ?? ""), h("td", { class: "ln" }, l.new ?? ""),
        h("td", { class: "sign", "aria-label": l.op === "-" ? "removed" : l.op === "+" ? "added" : "unchanged" }, l.op === "=" ? " " : l.op),
        h("td", { class: "code" }, content)));
    }
  }
  return h("div", { class: "scroll", tabindex: "0", role: "group", "aria-label": "Changed lines" },
    h("table", { class: "unified" }, h("tbody", {}, ...rows)));
}
