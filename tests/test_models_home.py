"""One home for the tiny models: kvresume.testing holds the standalone configs, helpers.models the kit's named
defaults built on them; the kit's defaults are kvresume.testing's models where they are the same model (same
config, same seed, the same weights bit for bit), and no other kit module builds a model config."""
from __future__ import annotations

import re

import pytest
import torch

from helpers import hybrid, models
from helpers.pipeline.paths import repo_root
from kvresume import testing

ROOT = repo_root()
CONFIG_CALL = re.compile(r"\b(Qwen3Config|Qwen3VLConfig|Qwen3_5TextConfig|LlamaConfig|BartConfig)\(")


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return a.config.to_dict() == b.config.to_dict() and sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("kind,kit", [("dense", lambda: models.build_tiny_qwen3(0)),
                                      ("sliding", lambda: models.build_tiny_qwen3(0, sliding_window=models.SLIDING_WINDOW)),
                                      ("assistant", lambda: models.build_tiny_qwen3(1))])
def test_the_kits_default_is_the_librarys_model(kind, kit):
    assert same(kit(), testing.build(kind))


def test_the_kits_variants_differ_from_the_librarys_only_where_they_say():
    hyb, lib = models.build_tiny_hybrid(0).config.to_dict(), testing.build("hybrid").config.to_dict()
    assert {k for k in hyb if hyb[k] != lib.get(k)} == {"max_position_embeddings"} and hyb["max_position_embeddings"] == 8192
    llama, lib = models.tiny_llama(0).config.to_dict(), testing.llama_config().to_dict()
    assert {k for k in llama if llama[k] != lib.get(k)} == {"pad_token_id"}
    assert models.build_tiny_hybrid(0, layer_types=hybrid.LAYOUTS["tiny dense"]()).config.layer_types == ["full_attention"] * 8


def test_no_other_kit_module_builds_a_model_config():
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "helpers").rglob("*.py") if CONFIG_CALL.search(p.read_text())]
    assert found == [], "build tiny models in helpers/models.py on kvresume.testing's configs"
