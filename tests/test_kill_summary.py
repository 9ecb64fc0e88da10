"""Kill tests (mutation testing, make mutants)."""
