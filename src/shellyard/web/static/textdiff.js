// Small converters of the file previews and diffs (docs/web.md "Previews", "Diffs"): a line
// diff (Myers' O(ND) algorithm) grouped into unified hunks, a word diff of a changed line
// pair, and a CSV/TSV parser (RFC 4180 quotes). Pure functions, no DOM.

// The edit script from ``a`` to ``b`` (arrays of strings): [{op: "=", "-", "+", text}].
// Beyond ``maxD`` edits it gives up and answers null (the caller shows "too different").
export function diffLines(a, b, maxD = 1000) {
  const n = a.length;
  const m = b.length;
  const max = Math.min(n + m, maxD);
  const offset = max + 1;
  let v = new Int32Array(2 * max + 3);
  const trace = [];
  for (let d = 0; d <= max; d += 1) {
    trace.push(v.slice());
    for (let k = -d; k <= d; k += 2) {
      let x = k === -d || (k !== d && v[offset + k - 1] < v[offset + k + 1])
        ? v[offset + k + 1] : v[offset + k - 1] + 1;
      let y = x - k;
      while (x < n && y < m && a[x] === b[y]) { x += 1; y += 1; }
      v[offset + k] = x;
      if (x >= n && y >= m) return backtrack(trace, v, a, b, d, offset);
    }
  }
  return null;
}

function backtrack(trace, last, a, b, dEnd, offset) {
  const ops = [];
  let x = a.length;
  let y = b.length;
  for (let d = dEnd; d > 0; d -= 1) {
    const v = trace[d];
    const k = x - y;
    const prevK = k === -d || (k !== d && v[offset + k - 1] < v[offset + k + 1]) ? k + 1 : k - 1;
    const prevX = v[offset + prevK];
    const prevY = prevX - prevK;
    while (x > prevX && y > prevY) { x -= 1; y -= 1; ops.push({ op: "=", text: a[x] }); }
    if (x === prevX) { y -= 1; ops.push({ op: "+", text: b[y] }); } else { x -= 1; ops.push({ op: "-", text: a[x] }); }
  }
  while (x > 0 && y > 0) { x -= 1; y -= 1; ops.push({ op: "=", text: a[x] }); }
  void last;
  return ops.reverse();
}

// Unified hunks of an edit script with ``context`` lines around each change, each line with
// its numbers: [{header, lines: [{op, text, old, new}]}].
export function hunks(ops, context = 3) {
  let oldNo = 1;
  let newNo = 1;
  const numbered = ops.map((o) => {
    const line = { ...o, old: o.op === "+" ? null : oldNo, new: o.op === "-" ? null : newNo };
    if (o.op !== "+") oldNo += 1;
    if (o.op !== "-") newNo += 1;
    return line;
  });
  const keep = new Array(numbered.length).fill(false);
  numbered.forEach((l, i) => {
    if (l.op === "=") return;
    for (let j = Math.max(0, i - context); j <= Math.min(numbered.length - 1, i + context); j += 1) keep[j] = true;
  });
  const out = [];
  let current = null;
  numbered.forEach((l, i) => {
    if (!keep[i]) { current = null; return; }
    if (!current) { current = { lines: [] }; out.push(current); }
    current.lines.push(l);
  });
  for (const hunk of out) {
    const first = hunk.lines[0];
    const oldStart = first.old ?? (hunk.lines.find((l) => l.old !== null)?.old ?? oldNo);
    const newStart = first.new ?? (hunk.lines.find((l) => l.new !== null)?.new ?? newNo);
    const oldCount = hunk.lines.filter((l) => l.op !== "+").length;
    const newCount = hunk.lines.filter((l) => l.op !== "-").length;
    hunk.header = `@@ -${oldStart},${oldCount} +${newStart},${newCount} @@`;
  }
  return out;
}

// The words of two changed lines, each marked changed or not: {old: [[text, changed]], new}.
export function diffWords(oldLine, newLine) {
  const split = (s) => s.match(/\w+|\s+|[^\w\s]/gu) || [];
  const a = split(oldLine);
  const b = split(newLine);
  const ops = diffLines(a, b, 400);
  if (!ops) return { old: [[oldLine, true]], new: [[newLine, true]] };
  const old = [];
  const fresh = [];
  const push = (list, text, changed) => {
    const tail = list[list.length - 1];
    if (tail && tail[1] === changed) tail[0] += text;
    else list.push([text, changed]);
  };
  for (const o of ops) {
    if (o.op === "=") { push(old, o.text, false); push(fresh, o.text, false); }
    else if (o.op === "-") push(old, o.text, true);
    else push(fresh, o.text, true);
  }
  return { old, new: fresh };
}

// Rows of a CSV (``sep`` ",") or TSV ("\t") text, at most ``maxRows``; quotes as RFC 4180.
// Answers {rows, truncated}: truncated when rows were left out or the last one was cut.
export function parseDelimited(text, sep = ",", maxRows = 200) {
  const rows = [];
  let row = [];
  let field = "";
  let quoted = false;
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (quoted) {
      if (c === '"') {
        if (text[i + 1] === '"') { field += '"'; i += 2; continue; }
        quoted = false;
      } else field += c;
      i += 1;
      continue;
    }
    if (c === '"' && field === "") quoted = true;
    else if (c === sep) { row.push(field); field = ""; }
    else if (c === "\n" || c === "\r") {
      if (c === "\r" && text[i + 1] === "\n") i += 1;
      row.push(field);
      field = "";
      rows.push(row);
      row = [];
      if (rows.length > maxRows) return { rows: rows.slice(0, maxRows), truncated: true };
    } else field += c;
    i += 1;
  }
  if (field !== "" || row.length) { row.push(field); rows.push(row); }
  return { rows: rows.slice(0, maxRows), truncated: rows.length > maxRows };
}
