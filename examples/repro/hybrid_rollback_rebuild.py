"""A Qwen3.5-style hybrid (Gated DeltaNet + full attention) rolled back and rebuilt (transformers #49036, 5.25.0's
linear-attention cache): tiny random model, CPU, seconds. (1) process k=4 tokens with past recording on, crop(-4),
feed the next token: against a cache that never saw the 4. (2) rebuild the cache by hand through the layers' own
update methods: the length it reports and how many cached tokens generate() with the full ids feeds again."""
import copy
import inspect
import time

import torch
import transformers
from transformers import DynamicCache, Qwen3_5ForCausalLM, Qwen3_5TextConfig

start = time.time()
types = ["linear_attention"] * 3 + ["full_attention"]
config = Qwen3_5TextConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                           linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, layer_types=types * 2,
                           tie_word_embeddings=False)
torch.manual_seed(0)
model = Qwen3_5ForCausalLM(config).eval()
CACHE = "past_key_values" if "past_key_values" in inspect.signature(model.forward).parameters else "cache"  # 5.24.0: cache
ids = torch.randint(10, 2038, (1, 25), generator=torch.Generator().manual_seed(0))
P, K = 20, 4


def run(x, cache):
    return model(input_ids=x, use_cache=True, **{CACHE: cache}).logits[:, -1]


with torch.no_grad():
    fresh = DynamicCache(config=config)
    run(ids[:, :P], fresh)
    floor = (model(input_ids=ids[:, :P + 1]).logits[:, -1] - run(ids[:, P:P + 1], copy.deepcopy(fresh))).abs().max().item()
    expected = run(ids[:, P + K:P + K + 1], copy.deepcopy(fresh))
    rolled = DynamicCache(config=config)
    run(ids[:, :P], rolled)
    try:  # 5.25.0 records the recurrent history only when told how many states to keep
        rolled.activate_past_recording(recurrent_states_to_keep=K)
    except TypeError:
        rolled.activate_past_recording()
    run(ids[:, P:P + K], rolled)
    rolled.crop(-K)
    got = (run(ids[:, P + K:P + K + 1], rolled) - expected).abs().max().item()

    source = DynamicCache(config=config)
    run(ids[:, :24], source)  # 24 tokens cached, the 25th not yet processed
    rebuilt = DynamicCache(config=config)
    for i, (layer, target) in enumerate(zip(source.layers, rebuilt.layers)):
        if isinstance(getattr(layer, "conv_states", None), dict):
            target.update_conv_state(layer.conv_states[0].clone(), 0, conv_kernel_size=layer.conv_kernel_size[0])
            target.update_recurrent_state(layer.recurrent_states[0].clone(), 0)
        else:
            rebuilt.update(layer.keys.clone(), layer.values.clone(), i)
    fed = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].shape[1]) if not fed else None,
                                           with_kwargs=True)
    length = int(rebuilt.get_seq_length())
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False, **{CACHE: rebuilt})
    hook.remove()

print(f"transformers {transformers.__version__}, torch {torch.__version__}; noise floor (full forward vs cached step) {floor:.3g}")
print(f"rollback crop(-{K}) with recording: next-token max |logit diff| expected <= {4 * max(floor, 1e-7):.3g}, got {got:.3g}: "
      f"{'restored' if got <= 4 * max(floor, 1e-7) else 'silently wrong'}")
print(f"hand-rebuilt hybrid: get_seq_length() expected 24, got {length}; generate() fed expected 1 token, got {fed[0]}: "
      f"{'ok' if length == 24 and fed[0] == 1 else 'wrong'}")
print(f"{time.time() - start:.1f} s")
