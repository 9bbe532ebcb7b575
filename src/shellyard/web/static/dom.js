// Small DOM helpers: elements from a tag, attributes and children; times in the browser's
// zone; byte counts; keyed lists that keep the focused control when a row is redrawn.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
const timeFormat = new Intl.DateTimeFormat(undefined, {
  year: "numeric",
  month: "2-digit",
  day: "2-digit",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  timeZoneName: "short",
});

// A UNIX time (seconds) in the browser's zone, in a <time> element with the ISO instant.
export function when(seconds) {
  if (seconds === null || seconds === undefined) return h("span", { class: "muted" }, "—");
  const date = new Date(seconds * 1000);
  return h("time", { datetime: date.toISOString(), title: `${date.toISOString()} (${zone})` },
    timeFormat.format(date));
}

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${n} B` : `${value.toFixed(1)} ${units[unit]}`;
}

export function badge(state) {
  const active = ["queued", "running", "unknown", "pending"].includes(state);
  return h("span", { class: `badge badge-${state}${active ? " badge-active" : ""}` }, state);
}

// Replace the children of ``container`` by one element per item, keyed by ``key(item)``:
// an item whose rendering input did not change keeps its element (and the focus in it); a
// redrawn one gets the focus back on the control with the same data-focus name.
export function keyedList(container, items, key, render) {
  const old = new Map();
  for (const child of container.children) old.set(child.dataset.key, child);
  const focused = document.activeElement;
  const wanted = [];
  for (const item of items) {
    const id = key(item);
    const sig = JSON.stringify(item);
    let el = old.get(id);
    let replaces = null;
    if (!el || el.dataset.sig !== sig) {
      const fresh = render(item);
      fresh.dataset.key = id;
      fresh.dataset.sig = sig;
      if (el && el.contains(focused) && focused.dataset.focus) {
        queueMicrotask(() => {
          const again = fresh.querySelector(`[data-focus="${focused.dataset.focus}"]`);
          if (again) again.focus();
        });
      }
      replaces = el || null;
      el = fresh;
    }
    wanted.push([el, replaces]);
  }
  // Move only what is out of place: untouched rows (and their focus) stay where they are; a
  // redrawn row takes its old one's place; an element marked data-keep (the log view's row,
  // placed by its owner) is left where it is.
  const skipKept = (el) => {
    let at = el;
    while (at && at.dataset.keep !== undefined) at = at.nextElementSibling;
    return at;
  };
  let cursor = skipKept(container.firstElementChild);
  for (const [el, replaces] of wanted) {
    if (el === cursor) {
      cursor = skipKept(cursor.nextElementSibling);
    } else if (replaces && replaces === cursor) {
      cursor.replaceWith(el);
      cursor = skipKept(el.nextElementSibling);
    } else {
      container.insertBefore(el, cursor);
    }
  }
  while (cursor) {
    const next = skipKept(cursor.nextElementSibling);
    cursor.remove();
    cursor = next;
  }
}

export function shortId(id) {
  return id && id.length > 14 ? `${id.slice(0, 14)}…` : id;
}
