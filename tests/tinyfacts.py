"""What the tiny random-weight models cannot show, shared by the end-to-end tests (tests/ is on sys.path)."""
# Statements of the source a tiny random-weight model decides by chance (top-1 changed on 15 of 40 prompts, cosine
# 0.968-0.995 where the source's 2B checkpoint changed top-1 at cosine 0.8698): on a tiny model they are skipped with
# that rate (boundary.by_chance); a real checkpoint (any model_id not "tiny-...") decides them.
NOT_ON_TINY = {"boundary.double_processing_top1_changed", "boundary.double_processing_cosine"}
