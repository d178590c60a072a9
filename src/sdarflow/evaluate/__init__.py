"""Evaluation: pass@k with its intervals (``metrics``), paired comparisons (``compare``) and the report with its
plots (``report``; matplotlib and Jinja2 are imported on first use, so importing this package stays cheap)."""
