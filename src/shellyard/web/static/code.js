// Syntax colour for text previews: highlight.js (vendored from its npm package, see
// vendor/highlight/README.md), chosen by the file's name only: guessing the language from the
// text is slow and often wrong, and a wrong guess is worse than none.
import hljs from "./vendor/highlight/highlight.min.js";

const BY_ENDING = {
  py: "python", pyi: "python", r: "r", sh: "bash", bash: "bash", zsh: "bash",
  js: "javascript", mjs: "javascript", cjs: "javascript", jsx: "javascript",
  ts: "typescript", tsx: "typescript", c: "c", h: "c", cc: "cpp", cpp: "cpp", cxx: "cpp",
  hpp: "cpp", rs: "rust", go: "go", java: "java", kt: "kotlin", swift: "swift", cs: "csharp",
  rb: "ruby", pl: "perl", php: "php", lua: "lua", sql: "sql", yaml: "yaml", yml: "yaml",
  toml: "ini", ini: "ini", cfg: "ini", css: "css", scss: "scss", less: "less", html: "xml",
  xml: "xml", svg: "xml", diff: "diff", patch: "diff", graphql: "graphql", mk: "makefile",
};
const BY_NAME = { makefile: "makefile", gnumakefile: "makefile", dockerfile: "bash" };
// Past this many characters the text is shown plain: colouring is linear, but the page keeps
// one span per token and a preview must stay quick.
export const MAX_COLOURED = 512 * 1024;

// The highlight.js language for a file name, or null (shown plain).
export function languageOf(name) {
  const lower = name.toLowerCase();
  if (BY_NAME[lower]) return BY_NAME[lower];
  const dot = lower.lastIndexOf(".");
  return dot > 0 ? BY_ENDING[lower.slice(dot + 1)] || null : null;
}

// ``pre``'s content as ``text`` in ``language``'s colours (plain text without one). The
// markup comes from highlight.js, which escapes the text itself; nothing else is inserted.
export function showCode(pre, text, language) {
  if (!language || text.length > MAX_COLOURED) {
    pre.textContent = text;
    return;
  }
  const code = document.createElement("code");
  code.className = `hljs language-${language}`;
  code.innerHTML = hljs.highlight(text, { language, ignoreIllegals: true }).value;
  pre.replaceChildren(code);
}
