"""Two threads generating on one tracked model keep their own ledgers (pending writes are kept per thread)."""
from __future__ import annotations

import threading

import torch

from kvresume import ledger_of, track
from kvresume.testing import build


def test_two_concurrent_generate_calls_keep_their_own_ledgers():
    m = build("dense")
    tracker = track(m)
    prompts = [torch.randint(10, 2000, (1, n), generator=torch.Generator().manual_seed(n)) for n in (9, 14)]
    results: dict[int, object] = {}
    start = threading.Barrier(2)

    def run(i: int) -> None:
        start.wait()
        with torch.no_grad():
            results[i] = m.generate(prompts[i], attention_mask=torch.ones_like(prompts[i]), max_new_tokens=24,
                                    do_sample=False, pad_token_id=0, return_dict_in_generate=True)

    for _ in range(3):
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(2):
            out = results[i]
            led = ledger_of(out.past_key_values)
            assert led is not None and torch.equal(led.token_ids, out.sequences[:, :-1])
            assert led.positions[0, 0].tolist() == list(range(out.sequences.shape[1] - 1))
    tracker.remove()
