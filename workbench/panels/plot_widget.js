// Browser side of workbench.panels._plot.PlotWidget (an anywidget module).
//
// The figure is one trait, `figure` (the figure as plotly JSON), of a plain ipywidgets model beside this
// one (the kernel's FigureState; its id is this model's `figure_model`). A view draws it with Plotly.react
// when it is created and again on every change, so a view always shows the current figure, however late it
// is created. Not in this model: anywidget gives a model 2 s to load this module, and one that misses it
// (a page held by other work on a loaded machine) drops every later update from the kernel, while its
// views are still made from its first state. The FigureState model has no such watchdog.
// plotly.js itself is not part of this module: it is read once per page from the kernel's PlotlyLibrary
// widget (its `source` trait, plotly.min.js from the plotly package) and evaluated once; every figure on
// the page shares that copy.

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

// The FigureState model holding this widget's figure (made by the kernel before this model).
async function figureState(model) {
  const id = model.get("figure_model");
  if (!id) throw new Error("no figure model (figure_model trait empty)");
  return model.widget_manager.get_model(id);
}

// JupyterLab's theme: <body data-jp-theme-light="true|false">. A dark theme gets the figure drawn on
// the page's own background with the theme's font and border colours (CSS variables), so a figure does
// not stay a white box in a dark notebook; the light theme keeps the figure's own colours. Outside
// JupyterLab (no attribute) the figure is drawn as it is.
function themeIsDark() {
  const body = document.body;
  return !!body && body.dataset && body.dataset.jpThemeLight === "false";
}

function cssVar(name, fallback) {
  const v = getComputedStyle(document.body).getPropertyValue(name).trim();
  return v || fallback;
}

function themed(layout) {
  if (!themeIsDark()) return layout;
  const fg = cssVar("--jp-ui-font-color1", "#e0e0e0");
  const grid = cssVar("--jp-border-color2", "#444");
  const out = Object.assign({}, layout);
  out.paper_bgcolor = cssVar("--jp-layout-color0", "#111");
  out.plot_bgcolor = cssVar("--jp-layout-color1", "#1a1a1a");
  out.font = Object.assign({}, layout.font || {}, { color: fg });
  out.legend = Object.assign({}, layout.legend || {}, { bgcolor: "rgba(0,0,0,0)" });
  const axes = Object.keys(layout).filter((k) => /^[xy]axis\d*$/.test(k));
  for (const k of new Set(["xaxis", "yaxis", ...axes])) {
    out[k] = Object.assign({}, layout[k] || {}, { gridcolor: grid, linecolor: grid, zerolinecolor: grid });
  }
  if (layout.title && typeof layout.title === "object") {
    out.title = Object.assign({}, layout.title, { font: Object.assign({}, layout.title.font || {}, { color: fg }) });
  }
  return out;
}

async function render({ model, el }) {
  el.classList.add("wb-plot");
  const div = document.createElement("div");
  div.className = "wb-plot-area";
  el.appendChild(div);
  let Plotly, state;
  try {
    [Plotly, state] = await Promise.all([plotlyFor(model), figureState(model)]);
  } catch (err) {
    div.textContent = `gpu-workbench: could not draw the figure (${err}). Re-run the cell; ` +
      "if it persists, reinstall plotly.";
    throw err;
  }
  let alive = true;
  let drawing = Promise.resolve();
  let queued = false;
  const draw = () => {
    // one draw at a time, always of the newest figure; changes that come while a draw waits need no draw
    // of their own (a live figure changes several times a second, faster than a loaded page draws)
    if (queued) return;
    queued = true;
    drawing = drawing.then(() => {
      queued = false;
      if (!alive) return;
      const fig = JSON.parse(state.get("figure") || "{}");
      const config = Object.assign({ responsive: true, displaylogo: false }, fig.config || {});
      // A figure without a height would take its box's, which has none: plotly's usual 450 px instead.
      const layout = themed(Object.assign({ height: 450 }, fig.layout || {}));
      el.dataset.wbTheme = themeIsDark() ? "dark" : "light";
      return Plotly.react(div, fig.data || [], layout, config);
    }).catch((err) => console.error("gpu-workbench: plotly could not draw the figure", err));
  };
  state.on("change:figure", draw);
  draw();
  // the user switches JupyterLab's theme: draw again in the new colours
  const themeWatch = new MutationObserver(() => {
    if (alive && el.dataset.wbTheme !== (themeIsDark() ? "dark" : "light")) draw();
  });
  if (document.body) themeWatch.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light"] });
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
    state.off("change:figure", draw);
    themeWatch.disconnect();
    resize.disconnect();
    Plotly.purge(div);
  };
}

export default { render };
