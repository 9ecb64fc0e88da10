"""Notebook 06: the resume-contract control's decision tree as a triage tool for any cache rebuild.

tree: the branches and their conditions; controls: the control steps (argument sets, explicit positions);
run: a rebuild triaged against the original; tables: its tables and figure; rebuilds: the built-in rebuilds
(on any cache family, through helpers.regress.rebuilds.layer_aware) and loading a user's `file.py:function`;
prompts: the reporter's prompt_text / prompt_ids and generate_kwargs.
"""
