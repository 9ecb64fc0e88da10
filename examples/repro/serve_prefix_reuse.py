"""What `transformers serve` does on turn 2 of a chat (transformers 5.17.0: `TODO: add prefix caching for the non-CB
path`): generate() over the whole rendered conversation, every prompt token prefilled again, against generate() with
turn 1's cache and the full ids, which feeds only the new tokens: tiny random Llama, CPU, seconds."""
import inspect
import time

import torch
import transformers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

start = time.time()
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2)).eval()
CACHE = "past_key_values" if "past_key_values" in inspect.signature(model.forward).parameters else "cache"  # 5.24.0
turn1 = torch.randint(10, 500, (1, 60), generator=torch.Generator().manual_seed(0))
fed = []
model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True)
greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
with torch.no_grad():
    cache = DynamicCache(config=model.config)
    out1 = model.generate(turn1, attention_mask=torch.ones_like(turn1), **greedy, **{CACHE: cache})
    turn2 = torch.cat([out1, torch.randint(10, 500, (1, 40), generator=torch.Generator().manual_seed(1))], 1)
    fed.clear()
    plain = model.generate(turn2, attention_mask=torch.ones_like(turn2), **greedy)  # what the server does
    plain_fed = fed[0]
    fed.clear()
    resumed = model.generate(turn2, attention_mask=torch.ones_like(turn2), **greedy, **{CACHE: cache})
cached = out1.shape[1] - 1  # the last generated token was never fed
print(f"transformers {transformers.__version__}, torch {torch.__version__}; turn 2: {turn2.shape[1]} prompt tokens")
print(f"re-prefilled as the server does: first model call gets {plain_fed} tokens (all of them)")
print(f"resumed from turn 1's cache ({cached} cached): expected {turn2.shape[1] - cached} tokens, got {fed[0]}; "
      f"tokens {'equal' if torch.equal(plain, resumed) else 'DIFFER'} to the re-prefill")
print(f"{time.time() - start:.1f} s")
