"""The "open in Perfetto" action of the ProfilerPanel's timeline.

The window on screen is written as a Chrome trace JSON file (:func:`workbench.io.chrome_trace.write_chrome_trace`,
flows included), and :class:`PerfettoLink` offers it in the browser two ways: **Open in Perfetto UI**
opens https://ui.perfetto.dev in a new tab and hands it the trace with Perfetto's documented
``postMessage`` protocol (send ``"PING"`` until the UI answers ``"PONG"``, then post
``{perfetto: {buffer, title, fileName}}``; nothing is uploaded, the trace stays in the browser), and
**download** saves the same bytes (for a machine that cannot reach ui.perfetto.dev: open the file there
with "Open trace file"). The path of the written file is shown as well, for the command line.

What is offered lives in a plain ipywidgets model beside the anywidget one (:class:`PerfettoOffer`), as a
:class:`~workbench.panels._plot.PlotWidget`'s figure does, and for the same reason: an anywidget model that
missed anywidget's 2 s module-load watchdog on a busy page drops every later update from the kernel, and the
offer comes on a click, long after the model was made.
"""

from __future__ import annotations

from workbench._optional import import_optional

anywidget = import_optional("anywidget", "for the ProfilerPanel's open-in-Perfetto link")

import ipywidgets  # noqa: E402
import traitlets  # noqa: E402

__all__ = ["PerfettoLink", "PerfettoOffer", "PERFETTO_URL"]

PERFETTO_URL = "https://ui.perfetto.dev"

_ESM = r"""
async function render({ model, el }) {
  el.classList.add("wb-perfetto");
  const box = document.createElement("span");
  el.appendChild(box);
  // what is offered: the kernel's PerfettoOffer, a plain ipywidgets model (see _perfetto.py)
  const offer = await model.widget_manager.get_model(model.get("offer_model"));
  function draw() {
    box.textContent = "";
    const name = offer.get("file_name");
    const data = offer.get("buffer");
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
        win.postMessage({ perfetto: { buffer, title: offer.get("title"), fileName: name } }, url);
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
  offer.on("change:buffer change:file_name", draw);
  draw();
  return () => offer.off("change:buffer change:file_name", draw);
}
export default { render };
"""


class PerfettoOffer(ipywidgets.Widget):
    """What a :class:`PerfettoLink` offers, as a plain ipywidgets model (never displayed itself)."""

    buffer = traitlets.Bytes(b"").tag(sync=True)
    file_name = traitlets.Unicode("").tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)


class PerfettoLink(anywidget.AnyWidget):
    """Browser side of the open-in-Perfetto action: ``buffer`` (the Chrome trace JSON bytes),
    ``file_name`` and ``title`` (kept in :attr:`offered`, a :class:`PerfettoOffer`); empty until
    :meth:`offer` is called."""

    _esm = _ESM
    offer_model = traitlets.Unicode("").tag(sync=True)
    url = traitlets.Unicode(PERFETTO_URL).tag(sync=True)

    def __init__(self, **kwargs):
        self.offered = PerfettoOffer()
        super().__init__(offer_model=self.offered.model_id, **kwargs)

    buffer = property(lambda self: self.offered.buffer, doc="the Chrome trace JSON bytes offered")
    file_name = property(lambda self: self.offered.file_name, doc="the file name the download gets")
    title = property(lambda self: self.offered.title, doc="the title Perfetto shows")

    def offer(self, data: bytes, file_name: str, title: str) -> None:
        with self.offered.hold_sync():
            self.offered.buffer = data
            self.offered.file_name = file_name
            self.offered.title = title

    def close(self) -> None:
        super().close()
        if getattr(self, "offered", None) is not None:  # None: the constructor raised before it
            self.offered.close()
