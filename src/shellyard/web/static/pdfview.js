// The first page of a PDF, drawn by PDF.js inside a frame the panel sandboxes (an opaque
// origin: no cookies, no access to the panel or its API, docs/web.md "Previews"). The panel
// reads the file's bytes and posts them here; this frame answers with the page count or the
// error. A PDF that exploited the parser would find itself in a page that can reach nothing.
import * as pdfjs from "./vendor/pdfjs/pdf.min.mjs";

pdfjs.GlobalWorkerOptions.workerSrc = new URL("./vendor/pdfjs/pdf.worker.min.mjs", import.meta.url).href;

const canvas = document.getElementById("page");
const status = document.getElementById("status");

async function draw(data, width) {
  // No eval (PDF.js's font compiler), no scripting, no external fetches.
  const doc = await pdfjs.getDocument({
    data, isEvalSupported: false, enableXfa: false, disableAutoFetch: true, disableStream: true,
    stopAtErrors: false,
  }).promise;
  const page = await doc.getPage(1);
  const unscaled = page.getViewport({ scale: 1 });
  const viewport = page.getViewport({ scale: Math.min(2, Math.max(0.25, width / unscaled.width)) });
  canvas.width = Math.floor(viewport.width);
  canvas.height = Math.floor(viewport.height);
  await page.render({ canvasContext: canvas.getContext("2d"), viewport }).promise;
  return { pages: doc.numPages, width: canvas.width, height: canvas.height };
}

window.addEventListener("message", async (event) => {
  if (event.source !== parent || !(event.data && event.data.pdf instanceof ArrayBuffer)) return;
  try {
    const drawn = await draw(new Uint8Array(event.data.pdf), event.data.width || 600);
    parent.postMessage({ shellyardPdf: "drawn", ...drawn }, "*");
  } catch (err) {
    status.textContent = `Not shown: ${err && err.message ? err.message : err}`;
    parent.postMessage({ shellyardPdf: "error", message: String(err && err.message || err) }, "*");
  }
});
parent.postMessage({ shellyardPdf: "ready" }, "*");
