"""Notebook 11: one chat through two real servers, plain `transformers serve` and `kvresume serve`.

`chat` builds the local model folder (a chat template that re-renders earlier turns when thinking is off, as Qwen3's
does), starts both servers, runs the same turns through each with the `openai` client and counts, per turn, what the
rendered prompts share; `decisions` turns the rows into verdicts (the first-token claim against the difference the
two servers show where they do the same work).
"""
