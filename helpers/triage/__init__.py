"""Notebook 06: the resume-contract control's decision tree as a triage tool for any cache rebuild.

facts: the plain numbers the tree decides from (argument sets, control 0's resume state, repairs); state: control 0,
the resume-state table, measured; repairs: each leaf's repair run on the rebuilt cache, and the localization of a copy
defect; walk: the tree's walk (a leaf named only when its repair restores); tree: rendering and the notebook's claims;
controls: the control steps (argument sets, explicit positions); run: a rebuild triaged against the original; tables:
its tables and figure; rebuilds: the built-in rebuilds and loading a user's `file.py:function`; prompts: the
reporter's prompt_text / prompt_ids and generate_kwargs; patterns / pattern_checks: the resume patterns.
"""
