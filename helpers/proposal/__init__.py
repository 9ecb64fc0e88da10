"""Notebook 08: the control's proposed resume API (the `kvresume` package) measured on the kit's own resume calls:
the population of calls (groups, cells), its blind spots, every refusal's advice run, the decisions and the
standalone upstream test file."""
