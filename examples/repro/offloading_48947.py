"""transformers #48947: DynamicCache(offloading=True) on a hybrid Gated-DeltaNet + attention model drifts from the
first decode step. On CPU: which prefetch reads the installed release leaves unordered after the offload copy that
fills their host buffer (stream calls recorded by stand-ins). With CUDA: the drift itself, offloading on vs off."""
import inspect

import torch
import transformers
from transformers import DynamicCache, Qwen3_5ForCausalLM, Qwen3_5TextConfig

torch.manual_seed(0)
config = Qwen3_5TextConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                           layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 2)
cuda = torch.cuda.is_available()
model = Qwen3_5ForCausalLM(config).to("cuda" if cuda else "cpu", torch.bfloat16 if cuda else torch.float32).eval()
CACHE = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.24.0 renames it


class Stream:  # a stand-in stream: a vector clock, joined by wait_stream; `with stream:` makes it current
    current = []

    def __init__(self, name):
        self.name, self.clock = name, {name: 0}

    def wait_stream(self, other):
        self.clock = {k: max(self.clock.get(k, 0), other.clock.get(k, 0)) for k in {*self.clock, *other.clock}}

    def __enter__(self):
        Stream.current.append(self)

    def __exit__(self, *exc):
        Stream.current.pop()


@torch.no_grad()
def unordered_prefetch_reads(steps=3):
    """Run the report's loop with the stand-ins; count prefetch reads not ordered after their offload copy."""
    compute, copy = Stream("compute"), Stream("copy")
    filled, reads = {}, []  # layer -> compute-stream tick of the offload copy that filled its host buffer
    real_default = torch.cuda.default_stream
    torch.cuda.default_stream = lambda *a, **k: compute
    try:
        cache = DynamicCache(config=model.config, offloading=True)
        cache.prefetch_stream = copy
        for i, layer in enumerate(cache.layers):
            def offload(i=i, real=layer.offload):
                compute.clock["compute"] += 1  # the copy to the host, on the compute stream
                filled[i] = compute.clock["compute"]
                real()

            def prefetch(i=i, real=layer.prefetch):
                stream = Stream.current[-1] if Stream.current else compute
                if i in filled:  # reads the host buffer the last offload filled
                    reads.append(stream.clock.get("compute", 0) >= filled[i])
                real()
            layer.offload, layer.prefetch = offload, prefetch
        ids = torch.randint(1000, 2000, (1, 16))
        out = model(input_ids=ids, use_cache=True, **{CACHE: cache})
        for _ in range(steps):
            out = model(input_ids=out.logits[:, -1:].argmax(-1), use_cache=True, **{CACHE: cache})
    finally:
        torch.cuda.default_stream = real_default
    return reads.count(False), len(reads)


@torch.no_grad()
def drift(offloading, ids):  # the report's loop: argmax stays on the device, no host wait
    past = DynamicCache(config=model.config, offloading=True) if offloading else None
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{CACHE: past})
    logits = [out.logits]
    for _ in range(3):
        past = getattr(out, "cache", None) or out.past_key_values
        out = model(input_ids=out.logits[:, -1:].argmax(-1), use_cache=True, **{CACHE: past})
        logits.append(out.logits)
    return logits


print(f"transformers {transformers.__version__}, torch {torch.__version__}, CUDA {cuda}")
bad, n = unordered_prefetch_reads()
print("expected (the report's race): prefetch reads that are not ordered after the offload copy filling their buffer")
print(f"got: {bad} of {n} prefetch reads unordered")
if not cuda:
    print(f"verdict: {'race possible' if bad else 'every prefetch read is ordered'} on transformers "
          f"{transformers.__version__} (CPU record); the drift itself needs CUDA: run this file on a GPU")
else:
    ids = torch.randint(1000, 2000, (2, 4096), device="cuda")
    steps = [float((a.float() - b.float()).abs().max()) for a, b in zip(drift(False, ids), drift(True, ids))]
    print("expected (the report, 27B): max |logit diff| per step 0.0, 2.1171875, 7.625, 17.4375")
    print(f"got: {', '.join(f'{d:.4g}' for d in steps)}")
    print(f"verdict: {'drifts after prefill' if steps[0] == 0 and max(steps[1:]) > 0 else 'no drift'} on transformers "
          f"{transformers.__version__}; {bad} of {n} prefetch reads unordered in the CPU record")
