"""Qwen3-VL multi-turn resume with a new image in turn 2 (`QwenLM/Qwen3-VL#1685`, `QwenLM/Qwen3-VL#1412`): plain
transformers, a tiny random-weight Qwen3-VL built from a config, CPU, a few seconds.

Turn 1 (text, image A: 49 image tokens, text; 82 tokens) is prefilled into a cache; turn 2 (text, image B: 25 image
tokens, text; 49 tokens) is resumed from it with generate(). Reference: one forward over both turns. Prints the
distance of the natural call and of the repair (positions from the model's own get_rope_index over the full ids and
both grids), and the (t, h, w) positions image B's tokens reached the model at. Run: python qwen3_vl_new_image_turn.py
"""
import copy
import inspect

import torch
import transformers
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

IMAGE, VIDEO, START, END = 2000, 2001, 2002, 2003
torch.manual_seed(0)
config = Qwen3VLConfig(
    text_config=dict(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                     rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": [8, 4, 4],
                                      "mrope_interleaved": True}),
    vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=128, patch_size=16,
                       spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0, 1],
                       num_position_embeddings=2304),
    image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
    tie_word_embeddings=False)
config._attn_implementation = "sdpa"
model = Qwen3VLForConditionalGeneration(config).eval()
params = inspect.signature(model.forward).parameters
CACHE = "past_key_values" if "past_key_values" in params else "cache"  # 5.24.0 renames it
TYPES = "mm_token_type_ids" in params

gen = torch.Generator().manual_seed(0)
text = lambda n: torch.randint(10, 1900, (1, n), generator=gen)  # noqa: E731
block = lambda n: torch.tensor([[START] + [IMAGE] * n + [END]])  # noqa: E731
turn1 = torch.cat([text(12), block(49), text(19)], dim=1)  # image A: 224x224 -> grid 1x14x14 -> 49 tokens
turn2 = torch.cat([text(8), block(25), text(14)], dim=1)  # image B: 160x160 -> grid 1x10x10 -> 25 tokens
full = torch.cat([turn1, turn2], dim=1)
grid_a, grid_b = torch.tensor([[1, 14, 14]]), torch.tensor([[1, 10, 10]])
pixels_a, pixels_b = torch.randn(196, 1536, generator=gen), torch.randn(100, 1536, generator=gen)
types = lambda ids: {"mm_token_type_ids": (ids == IMAGE).long()} if TYPES else {}  # noqa: E731
owner = model.model


def first_call_positions(call):
    """Run `call`; return (its result, the [t, h, w] rows the text rotary embedding got in the first model call)."""
    seen = []

    def hook(_module, args, kwargs):
        if not seen:
            p = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
            seen.append([p[min(i, p.shape[0] - 1), 0].tolist() for i in range(3)])

    handle = owner.language_model.rotary_emb.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        return call(), seen[0]
    finally:
        handle.remove()


def step(ids, cache, **kwargs):
    out = model.generate(input_ids=ids, max_new_tokens=1, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, **{CACHE: copy.deepcopy(cache)}, **kwargs)
    return out.logits[0][0]


def one_forward():
    """Last logits of one forward over both turns with both images (the reference)."""
    owner.rope_deltas = None
    return model(input_ids=full, attention_mask=torch.ones_like(full), pixel_values=torch.cat([pixels_a, pixels_b]),
                 image_grid_thw=torch.cat([grid_a, grid_b]), **types(full)).logits[0, -1]


with torch.no_grad():
    model.set_attn_implementation("eager")
    eager = one_forward()  # the same computation by another kernel: this dtype's rounding noise
    model.set_attn_implementation("sdpa")
    reference = one_forward()
    owner.rope_deltas = None
    out = model(input_ids=turn1, attention_mask=torch.ones_like(turn1), pixel_values=pixels_a, image_grid_thw=grid_a,
                use_cache=True, **types(turn1))
    cache = getattr(out, "cache", None) or out.past_key_values
    turn1_deltas = owner.rope_deltas.clone()
    mask = torch.ones_like(full)

    # The natural call: turn 2's ids, image B, the full mask, the turn-1 cache.
    natural, rows = first_call_positions(lambda: step(turn2, cache, attention_mask=mask, pixel_values=pixels_b,
                                                     image_grid_thw=grid_b, **types(turn2)))
    after = owner.rope_deltas.flatten().tolist()

    # The repair: turn 2's positions from the full sequence, passed explicitly (sequence index on top of t, h, w).
    rope_kwargs = {"image_grid_thw": torch.cat([grid_a, grid_b]), "attention_mask": mask,
                   **({"mm_token_type_ids": (full == IMAGE).long()} if "mm_token_type_ids" in
                      inspect.signature(owner.get_rope_index).parameters else {})}
    positions, deltas = owner.get_rope_index(full, **rope_kwargs)
    explicit = torch.cat([torch.arange(82, 131).view(1, 1, -1), positions[:, :, 82:]], dim=0)
    owner.rope_deltas = turn1_deltas.clone()
    repaired, fixed_rows = first_call_positions(lambda: step(turn2, cache, attention_mask=mask, pixel_values=pixels_b,
                                                             image_grid_thw=grid_b, position_ids=explicit, **types(turn2)))
    owner.rope_deltas = deltas  # carry rope_deltas forward to its value after turn 2 for the turns that follow

b0, b1 = 9, 33  # image B's first and last token inside turn 2
print(f"transformers {transformers.__version__}, torch {torch.__version__}")
print(f"noise floor: max |logit diff| of the same forward, eager vs sdpa {(eager - reference).abs().max():.3g}")
print(f"natural call: max |logit diff| vs one forward {(natural - reference).abs().max():.4g}, cosine "
      f"{torch.nn.functional.cosine_similarity(natural, reference, dim=0):.4f}")
print(f"  image B's tokens reached the model at t/h/w {[r[b0] for r in rows]} .. {[r[b1] for r in rows]}; "
      f"reference {[r[0, b0 + 82].item() for r in positions]} .. {[r[0, b1 + 82].item() for r in positions]}")
print(f"  rope_deltas after the call {after}; after one forward over both turns {deltas.flatten().tolist()}")
print(f"repair (explicit positions): max |logit diff| {(repaired - reference).abs().max():.3g}; image B at "
      f"{[r[b0] for r in fixed_rows]} .. {[r[b1] for r in fixed_rows]}")
