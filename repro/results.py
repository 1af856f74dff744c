"""Read the suite's result files from Python.

    from repro.results import load_table, load_runs

    table = load_table("results/table1")            # or results/clapping, results/bench
    table.scale, table.git_commit, table.created    # where the numbers came from
    table.row("uniform")["mha_loss_mean"]           # a row, by its first column (method)
    table.column("mla_delta_vs_uniform")            # one value per row
    runs = load_runs("results/table1/mha/runs")     # {run name: RunResult}
    runs["w16-4-4-16-4-4-s0"].val_curve             # ((step, validation loss), ...)

Tables are the ``.json`` files the experiments write (``table1.json``, ``clapping_table.json``,
``bench.json``): flat records in ``rows`` plus the rest of the document in ``doc``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.files import read_json
from repro.runs.store import RunResult

TABLE_FILES = ("table1.json", "clapping_table.json", "bench.json")


@dataclass(frozen=True)
class Table:
    path: str  # the json file
    doc: dict[str, Any]  # the whole document (settings, analysis, statistics, runs)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return list(self.doc["rows"])

    @property
    def scale(self) -> str | None:
        return self.doc.get("scale") or self.doc.get("preset")

    @property
    def git_commit(self) -> str | None:
        return self.doc.get("git_commit")

    @property
    def created(self) -> str | None:
        return self.doc.get("created")

    def row(self, name: str, key: str | None = None) -> dict[str, Any]:
        """The row whose ``key`` (default: its first column) equals ``name`` (or starts with it)."""
        key = key or next(iter(self.rows[0]))
        for row in self.rows:
            if str(row[key]) == name or str(row[key]).split(" (")[0] == name:
                return row
        raise KeyError(f"{self.path}: no row with {key}={name!r}; rows are {[r[key] for r in self.rows]}")

    def column(self, name: str) -> list[Any]:
        return [row.get(name) for row in self.rows]


def load_table(path: str | Path) -> Table:
    """A table from its json file or from the folder that holds it."""
    path = Path(path)
    if path.is_dir():
        found = [path / f for f in TABLE_FILES if (path / f).is_file()]
        if not found:
            raise FileNotFoundError(f"{path}: no {' / '.join(TABLE_FILES)} in it; run the experiment first")
        path = found[0]
    doc = read_json(path, "result table")
    if not isinstance(doc, dict) or "rows" not in doc:
        raise ValueError(f"{path}: not a result table (no 'rows')")
    return Table(str(path), doc)


def load_run(path: str | Path) -> RunResult:
    """One run's result (``<folder>/<name>.json``)."""
    return RunResult.from_dict(read_json(path, "run result"))


def load_runs(folder: str | Path) -> dict[str, RunResult]:
    """Every run result in a folder, by name."""
    return {p.stem: load_run(p) for p in sorted(Path(folder).glob("*.json"))}
