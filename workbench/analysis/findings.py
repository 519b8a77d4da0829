"""The one finding type: what an analysis reports about a trace, a snapshot or a set of ranks.

Trace rules (:mod:`workbench.analysis.trace.findings`), memory rules
(:mod:`workbench.analysis.memory.findings`) and the cross-rank view (:mod:`workbench.analysis.trace.ranks`)
all return :class:`Finding`; the JSON summaries hold ``[f.as_dict() for f in ...]`` and
:func:`workbench.figures.text.findings_html` renders either shape.

>>> f = Finding("no_history", "info", "No allocation history", {"events": 0})
>>> f.as_dict()
{'id': 'no_history', 'severity': 'info', 'message': 'No allocation history', 'evidence': {'events': 0}}
>>> sorted(["info", "critical", "warning"], key=severity_rank, reverse=True)
['critical', 'warning', 'info']
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["Finding", "SEVERITIES", "severity_rank"]

SEVERITIES = ("info", "warning", "critical")  # least to most severe
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``id``, ``severity`` (info/warning/critical), a ``message`` that carries the
    numbers and the fix, ``evidence`` (plain JSON-able numbers and names) and, where a model says what
    the fix would save, ``what_if`` (``{step_ms, step_ms_if_fixed, saved_fraction, change, measured,
    fix_code}``); ``fix_code``: the fix as a line of code when there is no what-if to carry it."""

    id: str
    severity: str
    message: str
    evidence: dict = field(default_factory=dict)
    what_if: dict | None = None
    fix_code: str = ""  # the fix as one line of code, for a finding whose fix has no what-if (else what_if's)

    def __post_init__(self):
        if self.severity not in _RANK:
            raise ValueError(f"Finding {self.id!r}: severity {self.severity!r} is not one of {SEVERITIES}")

    def as_dict(self) -> dict:
        """The JSON form: ``{id, severity, message, evidence}``, plus ``what_if`` and ``fix_code`` when
        there are."""
        d = asdict(self)
        if d["what_if"] is None:
            d.pop("what_if")
        if not d["fix_code"]:
            d.pop("fix_code")
        return d


def severity_rank(severity: str) -> int:
    """0 for info, 1 for warning, 2 for critical; -1 for anything else (an old or foreign document).
    The sort key wherever findings are ordered or compared by severity (trace findings, the diff)."""
    return _RANK.get(severity, -1)
