"""The markdown of a noise probe (Table 1's and the Clapping fine-tune's): one table shape, its
statistics from :func:`repro.stats.probe_noise` and :func:`repro.stats.probe_cells`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from repro.files import table_head
from repro.stats import probe_cells


def probe_table(
    prefix: str,
    reference: str,
    doc: Mapping[str, Any],
    lead_heads: Sequence[str],
    lead: Callable[[Mapping[str, Any]], list[str]],
    targets: Sequence[float],
) -> str:
    """A noise probe's markdown: its title (``prefix``, then what every probe says), each probe's
    own first columns (``lead_heads``, cells from ``lead``), then each row against ``reference``,
    the seeds each target needs and the seconds per run."""
    probes = doc["probes"]
    others = sorted({m for p in probes for m in p["rows"]})
    head = [*lead_heads, *(f"{m} vs {reference} (sd of diffs, p)" for m in others)]
    head += [f"seeds for {t:g} (alpha; /m)" for t in targets] + ["s per run"]
    title = (
        f"{prefix}: each row against {reference}, paired by seed; seeds needed at 80 % power for a paired "
        f"t-test at alpha and at alpha / {doc['holm_rows']} (Holm's strictest step)."
    )
    lines = table_head(title, head)
    lines += ["| " + " | ".join([*lead(p), *probe_cells(p, others, targets)]) + " |" for p in probes]
    return "\n".join(lines) + "\n"
