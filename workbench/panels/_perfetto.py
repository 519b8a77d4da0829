"""The "open in Perfetto" action of the ProfilerPanel's timeline.

The window on screen is written as a Chrome trace JSON file (:func:`workbench.io.chrome_trace.write_chrome_trace`,
flows included), and :class:`PerfettoLink` offers it in the browser two ways: **Open in Perfetto UI**
opens https://ui.perfetto.dev in a new tab and hands it the trace with Perfetto's documented
``postMessage`` protocol (send ``"PING"`` until the UI answers ``"PONG"``, then post
``{perfetto: {buffer, title, fileName}}``; nothing is uploaded, the trace stays in the browser), and
**download** saves the same bytes (for a machine that cannot reach ui.perfetto.dev: open the file there
with "Open trace file"). The path of the written file is shown as well, for the command line.
"""

from __future__ import annotations

from workbench._optional import import_optional

anywidget = import_optional("anywidget", "for the ProfilerPanel's open-in-Perfetto link")

import traitlets  # noqa: E402

__all__ = ["PerfettoLink", "PERFETTO_URL"]

PERFETTO_URL = "https://ui.perfetto.dev"

_ESM = r"""
function render({ model, el }) {
  el.classList.add("wb-perfetto");
  const box = document.createElement("span");
  el.appendChild(box);
  function draw() {
    box.textContent = "";
    const name = model.get("file_name");
    const data = model.get("buffer");
    const bytes = data && data.byteLength !== undefined ? data : null;
    if (!name || !bytes || bytes.byteLength === 0) return;
    const open = document.createElement("button");
    open.className = "wb-perfetto-open jupyter-button";
    open.textContent = "Open in Perfetto UI";
    open.title = "opens " + model.get("url") + " in a new tab and hands it this window (nothing is uploaded)";
    open.onclick = () => {
      const url = model.get("url");
      const win = window.open(url);
      if (!win) { open.textContent = "pop-up blocked: allow pop-ups, or download"; return; }
      const buffer = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
      let done = false;
      const onMessage = (evt) => {
        if (evt.source !== win || evt.data !== "PONG" || done) return;
        done = true;
        window.removeEventListener("message", onMessage);
        win.postMessage({ perfetto: { buffer, title: model.get("title"), fileName: name } }, url);
      };
      window.addEventListener("message", onMessage);
      const ping = setInterval(() => {
        if (done || win.closed) { clearInterval(ping); return; }
        win.postMessage("PING", url);
      }, 100);
      setTimeout(() => clearInterval(ping), 60000);
    };
    const link = document.createElement("a");
    link.className = "wb-perfetto-download";
    link.textContent = "download " + name;
    link.download = name;
    link.href = URL.createObjectURL(new Blob([bytes], { type: "application/json" }));
    link.style.marginLeft = "0.8em";
    box.appendChild(open);
    box.appendChild(link);
  }
  model.on("change:buffer", draw);
  model.on("change:file_name", draw);
  draw();
}
export default { render };
"""


class PerfettoLink(anywidget.AnyWidget):
    """Browser side of the open-in-Perfetto action: ``buffer`` (the Chrome trace JSON bytes),
    ``file_name`` and ``title``; empty until :meth:`offer` is called."""

    _esm = _ESM
    buffer = traitlets.Bytes(b"").tag(sync=True)
    file_name = traitlets.Unicode("").tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    url = traitlets.Unicode(PERFETTO_URL).tag(sync=True)

    def offer(self, data: bytes, file_name: str, title: str) -> None:
        with self.hold_sync():
            self.buffer = data
            self.file_name = file_name
            self.title = title
