"""The Qwen3-VL resume-contract control: generate() from an 81-token prefix cache with a one-token suffix, without
and with the full-length attention mask; what reaches the first model call, and what happens."""
import inspect

import torch
import transformers
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

torch.manual_seed(0)
text = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision)).eval()
CACHE = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.24.0 renames it
ids, seen = torch.randint(10, 250, (1, 82)), []
model.register_forward_pre_hook(lambda m, a, kw: seen.append(list(kw["input_ids"].shape)), with_kwargs=True)
expected = {"neither": "[1, 0], fails", "mask_only": "[1, 1], works"}  # the control's first calls (5.14.1)
got = {}
print(f"transformers {transformers.__version__}, torch {torch.__version__}")
for case, kw in {"neither": {}, "mask_only": {"attention_mask": torch.ones(1, 82, dtype=torch.long)}}.items():
    out = model(input_ids=ids[:, :-1])  # the prefix only: 81 tokens
    cache = getattr(out, "cache", None) or out.past_key_values
    seen.clear()
    try:
        model.generate(input_ids=ids[:, -1:], max_new_tokens=1, **{CACHE: cache}, **kw)
        result = "works"
    except Exception as exc:
        result = f"fails: {type(exc).__name__}: {str(exc).split(' because ')[0]}"
    got[case] = f"{seen[0]}, {result}"
    print(f"{case}: expected first call input_ids {expected[case]}; got {got[case]}")
same = all(got[c].split(":")[0].startswith(expected[c].split(":")[0]) for c in expected)
print(f"verdict: {'reproduces' if same else 'differs from'} the control on transformers {transformers.__version__}: "
      f"without the full mask the first call gets {got['neither']}; with it {got['mask_only']}")
