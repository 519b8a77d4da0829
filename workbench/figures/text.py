"""Findings' evidence as text a reader can use: numbers with units, lists as bullets, tables for records.

A finding's ``evidence`` is a plain JSON-able dict (``host_idle_us``, ``fp32_gemm_fraction``,
``top_kernels``, ``by_kind``...), made for machines. Every panel and HTML report shows findings through
:func:`findings_html` (one renderer for trace, memory and rank findings), and their evidence through
:func:`evidence_html`: the unit comes from the key's suffix (``_us`` -> µs/ms/s, ``_fraction`` -> %,
``bytes`` -> KiB/MiB/GiB, ``gb_per_s`` -> GB/s), lists become bullets with names cut to a line (the
full name on hover) and a dict of records becomes a small table.

>>> evidence_items({"idle_fraction": 0.503, "host_idle_us": 12_900.0, "host_idle_fraction": 0.437})
[('GPU idle', '50.3%'), ('host idle', '12.9 ms (43.7%)')]
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping

from workbench.units import format_bytes, format_us

__all__ = ["evidence_items", "evidence_html", "format_value", "findings_html", "what_if_html", "diagnosis_html",
           "advice_html", "fix_code_html", "readable_header", "readable_frame", "WHAT_IF_LABELS", "ADVICE_LABELS"]

# keys whose generic label reads badly
_LABELS = {
    "kernel_us": "all kernels over the window",
    "window_us": "profiled window",
    "fp32_gemm_us": "fp32 GEMM time over the window",
    "fp32_gemm_kernels": "fp32 GEMM launches over the window",
    "tensor_core_gemm_us": "tensor-core GEMM time over the window",
    "idle_fraction": "GPU idle over the window",
    "memory_us": "unhidden copy time over the window",
    "memory_fraction": "unhidden copies",
    "heavy_profiling": "recorded with stacks/memory",
    "top_kernels": "fp32 GEMM kernels",
    "calls": "blocking calls",
    "callers": "called from",
    "by_kind": "copies by kind",
    "kernels_per_ms": "kernel rate",
    "short_kernel_fraction": "kernels under 10 µs",
    "dataloader_us": "DataLoader calls",
    "x_events": "events",
}
_SKIP = {"device"}  # already in the panel's header / report title


def _label(key: str) -> str:
    if key in _LABELS:
        return _LABELS[key]
    k = key
    for suffix in ("_us", "_bytes", "_pct"):
        if k.endswith(suffix):
            k = k[: -len(suffix)]
    k = k.replace("_fraction", "").replace("_per_", " per ").replace("gb_per_s", "throughput")
    return k.replace("_", " ").strip() or key


def format_value(key: str, value) -> str:
    """One evidence value as text, its unit taken from the key (``*_us``, ``*_fraction``, ``bytes``...)."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        v = float(value)
        if math.isnan(v):
            return "n/a"
        if key.endswith("_us"):
            return format_us(v)
        if key.endswith("_fraction"):
            return f"{v * 100:.1f}%"
        if key.endswith("_pct"):
            return f"{v:.1f}%"
        if key == "bytes" or key.endswith("_bytes"):
            return format_bytes(v, significant=3)
        if key.endswith("gb_per_s"):
            return f"{v:,.1f} GB/s"
        if key.endswith("_per_ms"):
            return f"{v:,.3g} per ms"
        if isinstance(value, int) or v.is_integer():
            return f"{int(v):,}"
        return f"{v:,.3g}"
    return str(value)


def evidence_items(evidence: Mapping | None) -> list[tuple[str, str]]:
    """The scalar entries of an evidence dict as ``(label, value with unit)`` pairs, in their order.
    A share that has its time beside it (``host_idle_fraction`` next to ``host_idle_us``) goes in
    brackets after that time instead of on its own."""
    ev = dict(evidence or {})
    merged = {k for k in ev if k.endswith("_fraction") and k not in _LABELS
              and isinstance(ev.get(k[: -len("_fraction")] + "_us"), (int, float))}
    out = []
    for k, v in ev.items():
        if k in _SKIP or k in merged or isinstance(v, (list, tuple, Mapping)):
            continue
        text = format_value(str(k), v)
        share = str(k)[: -len("_us")] + "_fraction" if str(k).endswith("_us") else None
        if share in merged:
            text += f" ({format_value(share, ev[share])})"
        out.append((_label(str(k)), text))
    return out


def _name_html(name: str, width: int = 90) -> str:
    # kernel names: the template arguments carry the tile/precision, so cut the raw name, keep them
    s = str(name)[5:] if str(name).startswith("void ") else str(name)
    short = s if len(s) <= width else s[: width - 1] + "…"
    title = f" title='{html.escape(str(name), quote=True)}'" if short != str(name) else ""
    return f"<code{title}>{html.escape(short)}</code>"


def _records_table(records: Mapping) -> str:
    cols: list[str] = []
    for rec in records.values():
        for c in rec:
            if c not in cols:
                cols.append(c)
    head = "<th style='text-align:left;padding:0 8px 0 0'></th>" + "".join(
        f"<th style='text-align:right;padding:0 8px'>{html.escape(_label(c))}</th>" for c in cols)
    body = "".join(
        "<tr><td style='padding:0 8px 0 0'>" + html.escape(str(name)) + "</td>" + "".join(
            f"<td style='text-align:right;padding:0 8px'>{html.escape(format_value(c, rec.get(c)))}</td>"
            for c in cols) + "</tr>"
        for name, rec in records.items()
    )
    return f"<table class='wb-evidence-table' style='border-collapse:collapse'><tr>{head}</tr>{body}</table>"


def evidence_html(evidence: Mapping | None, *, max_list: int = 5) -> str:
    """HTML for an evidence dict: scalars as ``label value`` items separated by dots, lists as bullet
    lists (names shortened, the full name on hover), ``{name: count}`` dicts as ``name ×count`` bullets
    and ``{name: {field: value}}`` dicts as a small table. Empty string when there is nothing to show."""
    if not evidence:
        return ""
    items = " · ".join(
        f"<span class='wb-evidence-item'>{html.escape(lab)} <b>{html.escape(val)}</b></span>"
        for lab, val in evidence_items(evidence)
    )
    blocks = [f"<div>{items}</div>"] if items else []
    for k, v in evidence.items():
        if k in _SKIP or not isinstance(v, (list, tuple, Mapping)) or not v:
            continue
        label = html.escape(_label(str(k)))
        if isinstance(v, Mapping) and all(isinstance(r, Mapping) for r in v.values()):
            blocks.append(f"<div>{label}:</div>{_records_table(v)}")
            continue
        if isinstance(v, Mapping):
            lis = [f"<li>{_name_html(str(n))} ×{html.escape(format_value('count', c))}</li>"
                   for n, c in list(v.items())[:max_list]]
        else:
            lis = [f"<li>{_name_html(str(n))}</li>" for n in list(v)[:max_list]]
        more = f"<li>… {len(v) - max_list} more</li>" if len(v) > max_list else ""
        blocks.append(f"<div>{label}:</div><ul style='margin:0 0 0 1.2em;padding:0'>{''.join(lis)}{more}</ul>")
    if not blocks:
        return ""
    return f"<div class='wb-evidence' style='color:#555;font-size:11px;line-height:1.5'>{''.join(blocks)}</div>"


def what_if_html(w: dict | None) -> str:
    """A finding's what-if as one line: step time now and with the fix (both a step), and the saving.
    The change it stands for is in the finding's folded details."""
    if not w:
        return ""
    return (f"<div class='wb-whatif' style='margin:2px 0 0 0'><b>What if fixed:</b> "
            f"{w['step_ms']:,.2f} ms &rarr; <b>{w['step_ms_if_fixed']:,.2f} ms</b> a step "
            f"(saves <b>{100 * w['saved_fraction']:.0f}%</b>{', measured' if w.get('measured') else ''})</div>")


_SEVERITY_COLORS = {"critical": "#d55e00", "warning": "#e69f00", "info": "#0072b2"}
_MUTED = "color:var(--jp-ui-font-color2,#666)"
_CODE_BG = "background:var(--jp-layout-color2,#f2f2f2);color:var(--jp-content-font-color1,#111)"
# the copy button: the clipboard where the page may use it (https, localhost, a file), else the code selected
# for Ctrl-C; inline so that it works in a widget's HTML and in a report opened offline, with no script tag
_COPY_JS = ("var c=this.parentNode.querySelector('code'),b=this;"
            "function ok(m){b.textContent=m;setTimeout(function(){b.textContent='copy'},1500)}"
            "function sel(){var r=document.createRange();r.selectNodeContents(c);var s=getSelection();"
            "s.removeAllRanges();s.addRange(r);var d=false;try{d=document.execCommand('copy')}catch(e){}"
            "ok(d?'copied':'selected: Ctrl-C')}"
            "if(navigator.clipboard&&window.isSecureContext){navigator.clipboard.writeText(c.textContent)"
            ".then(function(){ok('copied')},sel)}else{sel()}")


def fix_code_html(code: str, note: str = "") -> str:
    """One line of code to paste, in ``<code class='wb-fix-code'>``, with a copy button (``wb-copy``) and
    an optional note after it. Empty string without code."""
    if not code:
        return ""
    note_html = f" <span class='wb-fix-note' style='{_MUTED};font-size:11px'>{html.escape(note)}</span>" if note else ""
    return (f"<div class='wb-fix' style='margin:4px 0;display:flex;align-items:center;gap:6px;flex-wrap:wrap'>"
            f"<span style='font-weight:600'>Fix:</span>"
            f"<code class='wb-fix-code' style='{_CODE_BG};padding:2px 6px;border-radius:3px;"
            f"font-family:var(--jp-code-font-family,monospace);font-size:12px;white-space:pre-wrap'>"
            f"{html.escape(code)}</code>"
            f"<button type='button' class='wb-copy' title='copy the line' onclick=\"{_COPY_JS}\" "
            f"style='font-size:11px;padding:0 6px;cursor:pointer'>copy</button>{note_html}</div>")


def _first_sentence(text: str) -> tuple[str, str]:
    """``text`` cut after its first sentence: (the sentence, the rest)."""
    m = re.search(r"(?<=[a-z0-9)\]%'])[.;]\s+(?=[A-Z(])", text)
    if not m:
        return text, ""
    return text[: m.start() + 1], text[m.end():]


def _get(f, key, default=None):
    return f.get(key, default) if isinstance(f, Mapping) else getattr(f, key, default)


def _finding_html(f) -> str:
    sev = str(_get(f, "severity", "info"))
    cls = html.escape(sev, quote=True)
    w = _get(f, "what_if")
    head, rest = _first_sentence(str(_get(f, "message", "")))
    code = ((w or {}).get("fix_code", "") if isinstance(w, Mapping) else "") or _get(f, "fix_code", "") or ""
    more = "".join((
        f"<div>{html.escape(rest)}</div>" if rest else "",
        f"<div style='{_MUTED}'>The what-if's change: {html.escape(str(w.get('change', '')))}</div>"
        if isinstance(w, Mapping) and w.get("change") else "",
        evidence_html(_get(f, "evidence") or {}),
    ))
    details = (f"<details class='wb-finding-details' style='margin:2px 0'><summary style='cursor:pointer;{_MUTED};"
               f"font-size:11px'>details and evidence</summary>{more}</details>") if more else ""
    return (f"<div class='finding {cls} wb-finding wb-finding-{cls}' "
            f"style='border-left:4px solid {_SEVERITY_COLORS.get(sev, '#888')};padding:2px 8px;margin:4px 0;"
            f"font-size:13px;line-height:1.45;max-width:1100px'>"
            f"<div class='wb-finding-head'><b>{html.escape(str(_get(f, 'id', '')))}</b> ({html.escape(sev)}): "
            f"{html.escape(head)}</div>{what_if_html(w)}{fix_code_html(code)}{details}</div>")


def findings_html(findings, diagnosis=None, *, empty: str = "<p>No findings.</p>") -> str:
    """Findings (:class:`~workbench.analysis.findings.Finding` objects or their JSON dicts) as HTML:
    the diagnosis card first when given (:func:`diagnosis_html`, with the what-ifs of the findings it does
    not hold), then one ``<div class='finding SEV wb-finding wb-finding-SEV'>`` a finding: id, severity and
    the message's first sentence, the what-if (a step), the fix as a line of code with a copy button, and
    the rest folded in ``<details>`` (the message, the change, the evidence as numbers with units); a
    border in the severity's colour. ``empty``: what to show when there are none (after the diagnosis). The
    panels and the HTML reports all render findings with this."""
    parts = [diagnosis_html(diagnosis, findings)] if diagnosis else []
    parts.extend(_finding_html(f) for f in findings or [])
    if not findings:
        parts.append(empty)
    return "".join(parts)


# -- bar charts in plain HTML (no script: a report opens offline, a widget shows it as is) --------------------

# short names of the what-ifs' causes, and of the findings whose what-if the diagnosis does not hold
WHAT_IF_LABELS = {
    "profiler": "without the profiler", "input": "DataLoader workers", "sync": "no syncs in the loop",
    "launch": "free launches (CUDA graphs)", "host": "host work off the step", "memcpy_pinned": "pinned copies",
    "memcpy": "no host↔device copies", "tf32": "TF32 tensor cores", "bf16": "bf16 autocast",
    "fp16": "fp16 autocast", "fp32_matmul": "fp32 GEMMs on tensor cores",
}
ADVICE_LABELS = {
    "remove_leak": "remove the leak", "expandable_segments": "expandable segments",
    "max_split_size": "max_split_size_mb", "zero_grad_set_to_none": "zero_grad(set_to_none)",
    "optimizer_adam_fused": "fused AdamW", "optimizer_adam_foreach_off": "AdamW foreach=False",
    "optimizer_adam8bit": "8-bit Adam", "optimizer_sgd_momentum": "SGD with momentum", "optimizer_sgd": "plain SGD",
    "bf16_autocast": "bf16 autocast", "checkpointing": "checkpoint each block", "batch": "smaller batch",
    "free_live": "free live tensors", "allocator_settings": "allocator settings", "bigger_gpu": "a bigger GPU",
}
_BAR_NOW = "#8a8a8a"
_BAR_FIX = "#0072b2"
_BAR_FITS, _BAR_NOFIT, _BAR_NOHELP = "#1a7f37", "#b42318", "#d8a19b"  # fits, does not fit, cannot help


def _bar_row(label: str, value: float, before: float | None, scale: float, color: str, text: str, *,
             cls: str, attrs: str = "", cap: float | None = None, title: str = "") -> str:
    """One row of an HTML bar chart: label, a bar to ``value`` (a lighter dashed segment on to ``before``:
    what the fix removes; a dark tick at ``cap``), the value as text."""
    pct = lambda v: f"{max(0.0, min(100.0, 100.0 * v / scale)):.2f}%" if scale > 0 else "0%"  # noqa: E731
    track = [f"<div style='position:absolute;left:0;top:2px;bottom:2px;width:{pct(value)};background:{color};"
             f"border-radius:2px'></div>"]
    if before is not None and before > value:
        track.append(f"<div class='wb-bar-saved' style='position:absolute;left:{pct(value)};top:2px;bottom:2px;"
                     f"width:calc({pct(before)} - {pct(value)});border:1px dashed {color};border-left:none;"
                     f"opacity:.55;box-sizing:border-box'></div>")
    if cap:
        track.append(f"<div class='wb-bar-cap' title='cap' style='position:absolute;left:{pct(cap)};top:-1px;"
                     f"bottom:-1px;width:2px;background:var(--jp-ui-font-color1,#222)'></div>")
    tip = f" title='{html.escape(title, quote=True)}'" if title else ""
    return (f"<div class='{cls}'{attrs}{tip} style='display:contents'>"
            f"<div class='wb-bar-label' style='text-align:right;white-space:nowrap;overflow:hidden;"
            f"text-overflow:ellipsis'>{html.escape(label)}</div>"
            f"<div class='wb-bar-track' style='position:relative;height:16px;min-width:80px'>{''.join(track)}</div>"
            f"<div class='wb-bar-value' style='white-space:nowrap'>{text}</div></div>")


def _bars(rows: list[str], cls: str) -> str:
    return (f"<div class='wb-bars {cls}' style='display:grid;grid-template-columns:minmax(8em,max-content) "
            f"minmax(120px,1fr) max-content;gap:3px 8px;align-items:center;margin:6px 0;font-size:12px'>"
            f"{''.join(rows)}</div>")


def _card(cls: str, color: str, body: str) -> str:
    return (f"<div class='wb-card {cls}' style='border:1px solid var(--jp-border-color2,#ddd);border-left:4px solid "
            f"{color};border-radius:4px;padding:6px 10px;margin:4px 0 8px 0;max-width:1100px;font-size:13px;line-height:1.45'>{body}</div>")


def _details(summary: str, body: str, cls: str = "wb-card-evidence") -> str:
    return (f"<details class='{cls}' style='margin:2px 0'><summary style='cursor:pointer;{_MUTED};font-size:11px'>"
            f"{html.escape(summary)}</summary><div style='font-size:12px;line-height:1.5'>{body}</div></details>")


def _what_if_rows(d: dict, findings) -> list[tuple[str, str, dict]]:
    """``(key, label, what-if dict)``: the diagnosis' what-ifs, then those of findings it does not hold."""
    out = [(c, WHAT_IF_LABELS.get(c, c), w) for c, w in (d.get("what_if") or {}).items()]
    changes = {w.get("change") for _, _, w in out}
    for f in findings or []:
        w = _get(f, "what_if")
        if isinstance(w, Mapping) and w.get("change") not in changes:
            fid = str(_get(f, "id", ""))
            out.append((fid, WHAT_IF_LABELS.get(fid, fid), w))
            changes.add(w.get("change"))
    return out


def diagnosis_html(d, findings=None) -> str:
    """The diagnosis card shown above the findings (``d``: a Diagnosis or its dict): one headline (the
    bound), the step's numbers each labelled "a step", a bar chart from the step now to the step after each
    what-if that saves at least 3% (largest saving first; ``findings``: their what-ifs the diagnosis does not
    hold are added, e.g. TF32), the fix of the bound as one line of code with a copy button, and the
    evidence folded under it (each what-if's change, the critical path, the model's notes)."""
    if not d:
        return ""
    from workbench.analysis.trace.diagnosis import BOUND_LABELS, REPORT_MIN_SAVING, fix_code

    if not isinstance(d, Mapping):
        d = d.as_dict()
    bound = str(d.get("bound", "gpu"))
    label = BOUND_LABELS.get(bound, bound)
    head, _, why = label.partition(":")
    step, unprof, busy = d["step_ms"], d.get("step_ms_unprofiled"), d.get("gpu_busy_ms")
    steps = d.get("steps")
    nums = [f"as recorded <b>{step:,.2f} ms</b> a step"
            + (f" (median of {steps} step{'s' if steps != 1 else ''}, {html.escape(str(d.get('detail', '?')))} "
               "detail)" if steps else "")]
    if unprof is not None:
        nums.append(f"about <b>{unprof:,.2f} ms</b> a step without the profiler")
    nums.append(f"GPU busy <b>{busy:,.2f} ms</b> a step" if busy else "no GPU activity")
    wis = _what_if_rows(d, findings)
    shown = sorted([r for r in wis if r[2].get("saved_fraction", 0) >= REPORT_MIN_SAVING],
                   key=lambda r: -r[2]["saved_fraction"])
    small = [r for r in wis if r not in shown]
    scale = max([step] + [float(w.get("step_ms") or 0) for _, _, w in shown]) * 1.02
    rows = [_bar_row("now, as recorded", step, None, scale, _BAR_NOW, f"<b>{step:,.2f} ms</b> a step",
                     cls="wb-bar-now")]
    for key, lab, w in shown:
        saved = float(w["saved_fraction"])
        rows.append(_bar_row(
            lab, float(w["step_ms_if_fixed"]), float(w["step_ms"]), scale, _BAR_FIX,
            f"<b>{w['step_ms_if_fixed']:,.2f} ms</b> a step · saves <b>{100 * saved:.0f}%</b>"
            + (" (measured)" if w.get("measured") else ""),
            cls="wb-bar-row", attrs=f" data-cause='{html.escape(key, quote=True)}' data-saved='{saved:.4f}'",
            title=str(w.get("change", ""))))
    chart = _bars(rows, "wb-diagnosis-bars") if shown else ""
    # the fix: the bound's own what-if when it is shown, else the largest saving
    want = {"memcpy": ("memcpy_pinned", "memcpy")}.get(bound, (bound,))
    pick = next((r for c in want for r in shown if r[0] == c), shown[0] if shown else None)
    fix = ""
    if pick is not None:
        code = pick[2].get("fix_code") or fix_code(pick[0])
        fix = fix_code_html(code, f"{pick[1]}: saves {100 * pick[2]['saved_fraction']:.0f}% of the step")
    else:  # no what-if saves enough: the fix of the most severe finding that has one (fp32 GEMMs, say)
        from workbench.analysis.findings import severity_rank

        coded = [f for f in findings or [] if _get(f, "fix_code")]
        if coded:
            f = max(coded, key=lambda f: severity_rank(str(_get(f, "severity", ""))))
            fix = fix_code_html(_get(f, "fix_code"), f"from {_get(f, 'id', '')}: no what-if for it on this trace")
    ev = []
    for key, lab, w in shown + small:
        ev.append(f"<li><b>{html.escape(lab)}</b> ({w['step_ms']:,.2f} &rarr; {w['step_ms_if_fixed']:,.2f} ms a step, "
                  f"saves {100 * float(w.get('saved_fraction', 0)):.0f}%): {html.escape(str(w.get('change', '')))}</li>")
    cp = d.get("critical_path_ms") or {}
    evidence = (f"<div>{html.escape(label)}.</div>"
                + (f"<div>Each fix, from the step model (shorter bar: the step with the fix; dashed: what it "
                   f"removes):</div><ul style='margin:0 0 0 1.2em;padding:0'>{''.join(ev)}</ul>" if ev else "")
                + ("<div>Critical path a step: " + html.escape(", ".join(f"{k} {v:,.2f} ms" for k, v in cp.items()))
                   + "</div>" if cp else "")
                + "".join(f"<div style='{_MUTED}'>{html.escape(str(n))}</div>" for n in d.get("notes") or []))
    body = (f"<div class='wb-diagnosis wb-card-headline' style='font-weight:600;font-size:14px'>Diagnosis: "
            f"{html.escape(head)}<span style='font-weight:400'>"
            f"{(' — ' + html.escape(why.strip())) if why else ''}</span></div>"
            f"<div class='wb-card-numbers' style='{_MUTED};font-size:12px'>{' · '.join(nums)}</div>"
            f"{chart}{fix}{_details('evidence: what each fix changes, the critical path, the notes', evidence)}")
    return _card("wb-diagnosis-card", _SEVERITY_COLORS["critical" if bound != "gpu" else "info"], body)


def advice_html(advice, *, headline: str = "", details: str = "") -> str:
    """An OOM's advice (``oom.advice``: each fix replayed through the allocator model) as a card: the
    headline, a bar chart of the peak as it is and the peak with each fix against the cap (the cap a dark
    tick; green: fits, red: does not; largest saving first), the cheapest fix that fits as one line of code
    with a copy button, and every advice text and ``details`` (raw HTML) folded under it."""
    from workbench.analysis.memory.whatif import advice_fix_code, advice_mark

    items = [a for a in advice or [] if (a.get("what_if") or {}).get("peak_if_fixed_bytes") is not None]
    if not items:
        return ""
    w0 = items[0]["what_if"]
    peak, cap = int(w0["peak_bytes"]), w0.get("cap_bytes")
    bars = [a for a in items if a.get("id") != "bigger_gpu"]
    saved = lambda a: (peak - a["what_if"]["peak_if_fixed_bytes"]) / peak if peak else 0.0  # noqa: E731
    bars.sort(key=lambda a: (-round(saved(a), 4), not a["what_if"]["fits"]))
    scale = max([peak, cap or 0] + [a["what_if"]["peak_if_fixed_bytes"] for a in bars]) * 1.02
    fb = format_bytes
    rows = [_bar_row("as it is", peak, None, scale, _BAR_NOW,
                     f"peak <b>{fb(peak)}</b>" + (f" vs cap {fb(cap)}" if cap else ""), cls="wb-bar-now", cap=cap)]
    for a in bars:
        w = a["what_if"]
        ok = bool(w.get("fits"))
        color = _BAR_FITS if ok else (_BAR_NOFIT if w["peak_if_fixed_bytes"] < peak * 0.995 else _BAR_NOHELP)
        mark = ("✓ " if ok else "✗ ") + advice_mark(a)
        rows.append(_bar_row(
            ADVICE_LABELS.get(a.get("id"), str(a.get("id"))), w["peak_if_fixed_bytes"], peak, scale,
            color,
            f"<span class='wb-advice-{'fits' if ok else 'nofit'}' style='color:{_BAR_NOFIT if color == _BAR_NOHELP else color}"
            f"{';opacity:.7' if color == _BAR_NOHELP else ''}'>"
            f"{html.escape(mark)}</span>", cls="wb-bar-row", cap=cap, title=str(a.get("text", "")),
            attrs=f" data-advice='{html.escape(str(a.get('id')), quote=True)}' data-saved='{saved(a):.4f}'"))
    pick = next((a for a in advice if (a.get("what_if") or {}).get("fits")
                 and (a.get("fix_code") or advice_fix_code(a.get("id", ""), (a.get("what_if") or {}).get("change")))),
                None)
    fix = ""
    if pick is not None:
        code = pick.get("fix_code") or advice_fix_code(pick["id"], pick["what_if"].get("change"))
        fix = fix_code_html(code, f"{ADVICE_LABELS.get(pick['id'], pick['id'])}: {advice_mark(pick)} "
                                  "(the cheapest fix that fits)")
    else:
        fix = f"<div class='wb-fix-none' style='margin:4px 0'><b>No replayed fix of the step fits under the cap.</b></div>"
    lis = "".join(
        f"<li><span class='wb-advice-{'fits' if (a.get('what_if') or {}).get('fits') else 'nofit'}' "
        f"style='font-weight:bold;color:{_BAR_FITS if (a.get('what_if') or {}).get('fits') else _BAR_NOFIT}'>"
        f"{'✓' if (a.get('what_if') or {}).get('fits') else '✗'} {html.escape(advice_mark(a))}</span> "
        f"{html.escape(str(a.get('text', '')))}</li>" for a in advice)
    evidence = f"<ul class='wb-memory-advice' style='margin:0 0 0 1.2em;padding:0'>{lis}</ul>{details}"
    n_fit = sum(1 for a in bars if a["what_if"].get("fits"))
    body = (f"<div class='wb-advice-headline wb-card-headline' style='font-weight:600;font-size:14px'>"
            f"{html.escape(headline)}</div>"
            f"<div class='wb-card-numbers' style='{_MUTED};font-size:12px'>the step's peak (reserved, one step) "
            f"<b>{fb(peak)}</b>" + (f" against a cap of <b>{fb(cap)}</b>" if cap else "")
            + f" · {n_fit} of {len(bars)} fixes fit when replayed</div>"
            + _bars(rows, "wb-advice-bars") + fix
            + _details("every fix in words, the allocator at the OOM", evidence))
    return _card("wb-advice-card", _SEVERITY_COLORS["critical"], body)


# -- tables for reading ------------------------------------------------------------------------------

_WORDS = {"cpu": "CPU", "gpu": "GPU", "device": "GPU", "pct": "%", "id": "id", "mem": "memory", "dur": "length",
          "util": "utilisation", "sm": "SM", "hbm": "HBM", "pcie": "PCIe", "nccl": "NCCL", "oom": "OOM"}
# suffix -> (unit shown in the header, scale from the stored unit)
_UNITS = (("_us", "ms", 1e-3), ("_ms", "ms", 1.0), ("_bytes", "MiB", 1.0 / 2**20), ("_fraction", "%", 100.0),
          ("_pct", "%", 1.0), ("_w", "W", 1.0), ("_mhz", "MHz", 1.0), ("_c", "°C", 1.0), ("_s", "s", 1.0))
_UNIT_FORMATS = {"ms": "{:,.3f}", "MiB": "{:,.2f}", "%": "{:.1f}", "W": "{:,.0f}", "MHz": "{:,.0f}", "°C": "{:.0f}",
                 "s": "{:,.2f}"}


def readable_header(column: str) -> tuple[str, str | None, float]:
    """``(header, unit, scale)`` for a snake_case column: ``total_us`` -> ``("total (ms)", "ms", 1e-3)``,
    ``device_self_us`` -> ``GPU self (ms)``, ``kernel_count`` -> ``kernel count``; a column that already
    reads as words (spaces, no underscore) is kept."""
    if "_" not in column or " " in column:
        return column, None, 1.0
    unit, scale, stem = None, 1.0, column
    for suffix, u, sc in _UNITS:
        if column.endswith(suffix) and len(column) > len(suffix):
            unit, scale, stem = u, sc, column[: -len(suffix)]
            break
    words = " ".join(_WORDS.get(w, w) for w in stem.split("_") if w)
    if column == "percent":
        return "%", "%", 1.0
    return (f"{words} ({unit})" if unit else words), unit, scale


def readable_frame(df) -> tuple[object, dict[str, str]]:
    """A copy of ``df`` for reading (times in ms, bytes in MiB, fractions in %, headers in words with
    their unit) and the float format of each converted column. Non-numeric columns keep their values."""
    import pandas as pd

    out = pd.DataFrame(index=df.index)
    formats: dict[str, str] = {}
    for c in df.columns:
        header, unit, scale = readable_header(str(c))
        col = df[c]
        if unit is not None and pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            col = col.astype("float64") * scale
            formats[header] = _UNIT_FORMATS.get(unit, "{:,.3f}")
        elif str(c) == "percent":
            header = "share (%)"
            formats[header] = "{:.1f}"
        if header in out.columns:  # two columns reading the same: keep the source name
            header = str(c)
        out[header] = col
    return out, formats
