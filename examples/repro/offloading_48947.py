import sys
import torch
from transformers import DynamicCache, Qwen3_5ForCausalLM, Qwen3_5TextConfig

if not torch.cuda.is_available():
    print("needs CUDA: offloading copies cache layers GPU<->CPU on CUDA streams; not run here")
    sys.exit(0)
torch.manual_seed(0)
config = Qwen3_5TextConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                           layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2)
model = Qwen3_5ForCausalLM(config).to("cuda", torch.bfloat16).eval()
ids = torch.randint(1000, 2000, (2, 4096), device="cuda")


@torch.no_grad()
def run(offloading):  # the report's loop: argmax stays on the device, no host wait
    past = DynamicCache(config=model.config, offloading=True) if offloading else None
    out = model(input_ids=ids, past_key_values=past, use_cache=True, logits_to_keep=1)
    logits = [out.logits]
    for _ in range(3):
        out = model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
        logits.append(out.logits)
    return logits


for step, (a, b) in enumerate(zip(run(False), run(True))):
    print(step, "max_abs_diff", float((a.float() - b.float()).abs().max()))
