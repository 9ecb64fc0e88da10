"""A new image after a cached Qwen3-VL turn (`QwenLM/Qwen3-VL#1685`, `#1412`): tiny random model, CPU, seconds.
Turn 1 (82 tokens, image A: 49 image tokens) is cached; turn 2 (49 tokens, image B: 25) resumes from it with
generate(); reference: one forward over both turns. Repair: turn 2's positions from get_rope_index over all ids."""
import copy
import inspect

import torch
import transformers
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

IMG, START, END = 2000, 2002, 2003
torch.manual_seed(0)
rope = {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [8, 4, 4], "mrope_interleaved": True}
text = dict(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, rope_parameters=rope)
vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=128, patch_size=16,
              spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0, 1], num_position_embeddings=2304)
config = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=IMG, video_token_id=2001,
                       vision_start_token_id=START, vision_end_token_id=END, tie_word_embeddings=False)
config._attn_implementation = "sdpa"
model = Qwen3VLForConditionalGeneration(config).eval()
inner, params = model.model, inspect.signature(model.forward).parameters
CACHE = "past_key_values" if "past_key_values" in params else "cache"  # 5.24.0 renames it
types = lambda ids: {"mm_token_type_ids": (ids == IMG).long()} if "mm_token_type_ids" in params else {}  # noqa: E731
gen = torch.Generator().manual_seed(0)
words = lambda n: torch.randint(10, 1900, (1, n), generator=gen)  # noqa: E731
image = lambda n: torch.tensor([[START] + [IMG] * n + [END]])  # noqa: E731
turn1, turn2 = torch.cat([words(12), image(49), words(19)], 1), torch.cat([words(8), image(25), words(14)], 1)
full, mask = torch.cat([turn1, turn2], 1), torch.ones(1, 131, dtype=torch.long)
grid_a, grid_b = torch.tensor([[1, 14, 14]]), torch.tensor([[1, 10, 10]])  # 224x224 and 160x160 pixels
pixels_a, pixels_b = torch.randn(196, 1536, generator=gen), torch.randn(100, 1536, generator=gen)
grids, seen = torch.cat([grid_a, grid_b]), []


def rows(_module, args, kwargs):  # the (t, h, w) rows the rotary embedding gets in the first model call
    p = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
    seen.append([p[min(i, p.shape[0] - 1), 0].tolist() for i in range(3)])


def reference():
    inner.rope_deltas = None
    return model(input_ids=full, attention_mask=mask, pixel_values=torch.cat([pixels_a, pixels_b]),
                 image_grid_thw=grids, **types(full)).logits[0, -1]


def turn_2(**kwargs):
    seen.clear()
    out = model.generate(input_ids=turn2, attention_mask=mask, pixel_values=pixels_b, image_grid_thw=grid_b,
                         max_new_tokens=1, do_sample=False, output_logits=True, return_dict_in_generate=True,
                         **{CACHE: copy.deepcopy(cache)}, **types(turn2), **kwargs)
    return out.logits[0][0], seen[0]


inner.language_model.rotary_emb.register_forward_pre_hook(rows, with_kwargs=True)
with torch.no_grad():
    model.set_attn_implementation("eager")
    eager = reference()  # the same computation by another kernel: the noise floor
    model.set_attn_implementation("sdpa")
    ref = reference()
    inner.rope_deltas = None
    out = model(input_ids=turn1, attention_mask=mask[:, :82], pixel_values=pixels_a, image_grid_thw=grid_a, **types(turn1))
    cache, deltas1 = getattr(out, "cache", None) or out.past_key_values, inner.rope_deltas.clone()
    natural, got = turn_2()  # the natural call: turn 2's ids, image B, the full mask, turn 1's cache
    after = inner.rope_deltas.flatten().tolist()
    extra = {"mm_token_type_ids": (full == IMG).long()} if "mm_token_type_ids" in inspect.signature(
        inner.get_rope_index).parameters else {}
    positions, deltas = inner.get_rope_index(full, image_grid_thw=grids, attention_mask=mask, **extra)
    inner.rope_deltas = deltas1
    fixed, fixed_rows = turn_2(position_ids=torch.cat([torch.arange(82, 131).view(1, 1, -1), positions[:, :, 82:]]))
    inner.rope_deltas = deltas  # carried forward: its value after turn 2, for the turns that follow

b0, b1 = 9, 33  # image B's first and last token in turn 2
floor = 4 * float((eager - ref).abs().max())  # the same forward by two kernels, with a margin of 4
wrong, repaired = float((natural - ref).abs().max()), float((fixed - ref).abs().max())
print(f"transformers {transformers.__version__}, torch {torch.__version__}")
print(f"noise threshold: 4 x max |logit diff| of the same forward, eager vs sdpa = {floor:.3g}")
print(f"natural call: expected max |logit diff| vs one forward <= {floor:.3g}; got {wrong:.4g}, cosine "
      f"{torch.nn.functional.cosine_similarity(natural, ref, dim=0):.4f}")
print(f"  image B's tokens: expected t/h/w {[r[0, b0 + 82].item() for r in positions]} .. "
      f"{[r[0, b1 + 82].item() for r in positions]}; got {[r[b0] for r in got]} .. {[r[b1] for r in got]}")
print(f"  rope_deltas after the call: expected {deltas.flatten().tolist()}; got {after}")
print(f"repair (positions from get_rope_index over all ids, rope_deltas carried): max |logit diff| {repaired:.3g}; "
      f"image B at {[r[b0] for r in fixed_rows]} .. {[r[b1] for r in fixed_rows]}")
print(f"verdict: the natural call is {'silently wrong' if wrong > floor else 'within the noise'} on transformers "
      f"{transformers.__version__} ({wrong:.4g} vs threshold {floor:.3g}); the repair "
      f"{'restores it' if repaired <= floor else 'does not restore it'} ({repaired:.3g})")
