"""``make reproduce-table1``: settings (settings.py), the plan of runs (plan.py), the orchestration
(run.py), the typed outcome (results.py) and the table files (report.py)."""
