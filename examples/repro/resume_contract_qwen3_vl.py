import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

torch.manual_seed(0)
text = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision)).eval()
ids, seen = torch.randint(10, 250, (1, 82)), []
model.register_forward_pre_hook(lambda m, a, kw: seen.append(list(kw["input_ids"].shape)), with_kwargs=True)
for case, kw in {"neither": {}, "mask_only": {"attention_mask": torch.ones(1, 82, dtype=torch.long)}}.items():
    cache = model(input_ids=ids[:, :-1]).past_key_values  # the prefix only: 81 tokens
    seen.clear()
    try:
        model.generate(input_ids=ids[:, -1:], past_key_values=cache, max_new_tokens=1, **kw)
        result = "worked"
    except Exception as exc:
        result = f"failed ({type(exc).__name__})"
    print(f"{case}: first model call input_ids shape {seen[0]}; {result}")
