"""``make reproduce-clapping``: settings (settings.py), the grid of runs (plan.py), the orchestration
(run.py) and the table files (report.py)."""
