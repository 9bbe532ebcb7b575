// Markdown shown safely (docs/web.md "Previews"): a few constructs — headings, paragraphs,
// lists, fenced code, quotes, rules, inline code, bold, italic — built as elements with text
// nodes. Raw HTML is text, links are shown as their text and address, never followed: nothing
// in a workspace file can add markup, script or a request to the page.

import { h } from "./dom.js";

// Inline: `code`, **bold**, *italic* / _italic_, [text](address) as "text (address)".
export function inline(text) {
  const out = [];
  const pattern = /`([^`]+)`|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|_([^_\s][^_]*)_|\[([^\]]+)\]\(([^)\s]+)\)/g;
  let last = 0;
  for (const m of text.matchAll(pattern)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    if (m[1] !== undefined) out.push(h("code", {}, m[1]));
    else if (m[2] !== undefined) out.push(h("strong", {}, m[2]));
    else if (m[3] !== undefined || m[4] !== undefined) out.push(h("em", {}, m[3] ?? m[4]));
    else out.push(m[5], h("span", { class: "muted" }, ` (${m[6]})`));
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

export function renderMarkdown(source) {
  const root = h("div", { class: "markdown" });
  const lines = source.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) root.append(h("p", {}, ...inline(paragraph.join(" "))));
    paragraph = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = /^\s*(```|~~~)/.exec(line);
    if (fence) {
      flush();
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trimStart().startsWith(fence[1])) { body.push(lines[i]); i += 1; }
      root.append(h("pre", { class: "text" }, h("code", {}, body.join("\n"))));
      i += 1;
      continue;
    }
    const heading = /^(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line);
    if (heading) {
      flush();
      // Inside the preview, headings start below the preview's own (h4): h5, h6 at most.
      root.append(h(heading[1].length === 1 ? "h5" : "h6", { class: `md-h${heading[1].length}` }, ...inline(heading[2])));
      i += 1;
      continue;
    }
    if (/^\s*([-*_])\s*(\1\s*){2,}$/.test(line)) { flush(); root.append(h("hr")); i += 1; continue; }
    const item = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(line);
    if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      const list = h(ordered ? "ol" : "ul");
      while (i < lines.length) {
        const next = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(lines[i]);
        if (!next) break;
        list.append(h("li", {}, ...inline(next[2])));
        i += 1;
      }
      root.append(list);
      continue;
    }
    if (/^\s*>/.test(line)) {
      flush();
      const quote = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) { quote.push(lines[i].replace(/^\s*>\s?/, "")); i += 1; }
      root.append(h("blockquote", {}, ...inline(quote.join(" "))));
      continue;
    }
    if (!line.trim()) flush();
    else paragraph.push(line.trim());
    i += 1;
  }
  flush();
  return root;
}
