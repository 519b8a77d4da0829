// Browser side of workbench.panels._plot.PlotWidget (an anywidget module).
//
// The widget's whole state is one trait, `figure` (the figure as plotly JSON). A view draws it with
// Plotly.react when it is created and again on every change, so a view always shows the current figure,
// however late it is created. plotly.js itself is not part of this module: it is read once per page from
// the kernel's PlotlyLibrary widget (its `source` trait, plotly.min.js from the plotly package) and
// evaluated once; every figure on the page shares that copy.

const CACHE = Symbol.for("gpu-workbench.plotly");

function plotlyFor(model) {
  const cache = (globalThis[CACHE] ??= new Map());
  const version = model.get("plotly_version");
  let loading = cache.get(version);
  if (!loading) {
    loading = (async () => {
      const id = model.get("library");
      if (!id) throw new Error("no plotly library model (library trait empty)");
      const library = await model.widget_manager.get_model(id);
      const source = library.get("source");
      if (!source) throw new Error("the plotly library model has no source");
      // Evaluating plotly.js holds the page for about a second (more on a busy machine). anywidget gives
      // each widget model 2 s from its creation to load its module, and a model that misses it ignores
      // every later update. So wait until the page has nothing queued (other models' modules loaded).
      if (typeof requestIdleCallback === "function") {
        await new Promise((resolve) => requestIdleCallback(resolve, { timeout: 1500 }));
      }
      // plotly.min.js is a UMD bundle: given a CommonJS `module`, it puts Plotly in module.exports.
      const mod = { exports: {} };
      new Function("module", "exports", "define", source).call(globalThis, mod, mod.exports, undefined);
      if (!mod.exports || typeof mod.exports.react !== "function") {
        throw new Error("plotly.js did not load (no Plotly.react)");
      }
      return mod.exports;
    })();
    loading.catch(() => cache.delete(version)); // a failed load is tried again by the next view
    cache.set(version, loading);
  }
  return loading;
}

async function render({ model, el }) {
  el.classList.add("wb-plot");
  const div = document.createElement("div");
  div.className = "wb-plot-area";
  el.appendChild(div);
  let Plotly;
  try {
    Plotly = await plotlyFor(model);
  } catch (err) {
    div.textContent = `gpu-workbench: could not load plotly.js (${err}). Re-run the cell; if it persists, reinstall plotly.`;
    throw err;
  }
  let alive = true;
  let drawing = Promise.resolve();
  const draw = () => {
    // one draw at a time, always of the newest figure
    drawing = drawing.then(() => {
      if (!alive) return;
      const fig = JSON.parse(model.get("figure") || "{}");
      const config = Object.assign({ responsive: true, displaylogo: false }, fig.config || {});
      // A figure without a height would take its box's, which has none: plotly's usual 450 px instead.
      const layout = Object.assign({ height: 450 }, fig.layout || {});
      return Plotly.react(div, fig.data || [], layout, config);
    }).catch((err) => console.error("gpu-workbench: plotly could not draw the figure", err));
  };
  draw();
  model.on("change:figure", draw);
  await drawing; // plotly gives the div its event methods when it first draws
  // Zoom, pan, axis reset by the user go back to Python (PlotWidget.on_relayout). Only axis ranges are
  // sent: plotly also reports its own autosize and drag-mode changes as relayouts.
  div.on?.("plotly_relayout", (ev) => {
    const data = {};
    for (const [k, v] of Object.entries(ev || {})) {
      if (/^[xy]axis\d*\.(range(\[[01]\])?|autorange)$/.test(k)) data[k] = v;
    }
    if (Object.keys(data).length) model.send({ type: "relayout", data });
  });
  // A figure drawn while hidden (a tab not selected) or before the cell had its width is laid out again
  // when its box changes size.
  let last = 0;
  const resize = new ResizeObserver(() => {
    const w = el.clientWidth;
    if (alive && w > 0 && w !== last && div.offsetParent !== null) {
      last = w;
      drawing = drawing.then(() => alive && Plotly.Plots.resize(div)).catch(() => {});
    }
  });
  resize.observe(el);
  return () => {
    alive = false;
    model.off("change:figure", draw);
    resize.disconnect();
    Plotly.purge(div);
  };
}

export default { render };
