"""Model math and checkpoints vs Hugging Face ``transformers``' ``Qwen3ForCausalLM`` (same weights)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import reference
from reference import ConfigError, Engine, ModelConfig
from reference.model import Qwen3Model
from reference.oracle import dense_logits
from reference.weights import random_weights

from _helpers import BF16_EPS, TINY, rand_ids

FP32_TOL = 1e-4

CONFIGS = {
    # the named tiny config: untied head, GQA 2, head_dim 32 != 64/4
    "tiny-untied-gqa2": TINY,
    # tied head, GQA 1 (MHA), head_dim 24 != 48/4
    "tied-gqa1": ModelConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, head_dim=24,
                             max_position_embeddings=512, tie_word_embeddings=True),
    # untied, GQA 4, head_dim 8 != 32/8, non-default rope theta
    "untied-gqa4": ModelConfig(vocab_size=257, hidden_size=32, intermediate_size=80, num_hidden_layers=3,
                               num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                               max_position_embeddings=512, rope_theta=10_000.0, tie_word_embeddings=False),
    # tied, GQA 4 with a single KV head, head_dim == hidden/heads
    "tied-gqa4-kv1": ModelConfig(vocab_size=320, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                 max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=True),
}


def hf_model(cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype=torch.float32):
    hc = transformers.Qwen3Config(**cfg.to_hf_dict(), attn_implementation="eager")
    m = transformers.Qwen3ForCausalLM(hc)
    missing, unexpected = m.load_state_dict(weights, strict=not cfg.tie_word_embeddings)
    assert not unexpected, unexpected
    if cfg.tie_word_embeddings:
        assert missing == ["lm_head.weight"], missing
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr(), "HF head is not tied"
    assert m.config._attn_implementation == "eager"
    return m.to(dtype).eval()


@torch.no_grad()
def hf_logits(m, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids])
    return m(input_ids=x, attention_mask=torch.ones_like(x)).logits[0].float()


def _ids(cfg, n=45, seed=0):
    return rand_ids(random.Random(seed), n, cfg.vocab_size)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fp32_logits_equal_hf(name):
    cfg = CONFIGS[name]
    w = random_weights(cfg, seed=7)
    ref = hf_logits(hf_model(cfg, w), ids := _ids(cfg))
    eng = Engine.from_state_dict(cfg, w, block_size=8, num_blocks=16, max_model_len=128)
    got = eng.score(ids)
    assert got.dtype == torch.float32 and got.shape == (len(ids), cfg.vocab_size)
    err = (got - ref).abs().max().item()
    dense = dense_logits(Qwen3Model(cfg, w), ids)
    err_dense = (dense - ref).abs().max().item()
    print(f"{name}: |score - HF| max {err:.2e}, |dense oracle - HF| max {err_dense:.2e}, |logit| max {ref.abs().max():.2f}")
    assert err <= FP32_TOL, f"{name}: engine.score differs from HF Qwen3ForCausalLM by {err:.2e} > {FP32_TOL}"
    assert err_dense <= FP32_TOL, f"{name}: dense oracle differs from HF by {err_dense:.2e} > {FP32_TOL}"


@pytest.mark.parametrize("name", ["tiny-untied-gqa2", "tied-gqa1", "untied-gqa4"])
def test_bf16_logits_flash_attention_rule(name):
    """err(ref bf16 vs HF fp32) <= 2 * err(HF bf16 vs HF fp32) + one bf16 rounding step of the logit
    magnitude, for the max and the mean error."""
    cfg = CONFIGS[name]
    w = random_weights(cfg, seed=3)
    ids = _ids(cfg, 64, seed=1)
    gold = hf_logits(hf_model(cfg, w), ids)
    hf_bf16 = hf_logits(hf_model(cfg, w, torch.bfloat16), ids)
    eng = Engine.from_state_dict(cfg, w, block_size=8, num_blocks=16, max_model_len=128, dtype="bfloat16")
    ref_bf16 = eng.score(ids)
    dense_bf16 = dense_logits(Qwen3Model(cfg, w, torch.bfloat16), ids)
    assert ref_bf16.dtype == torch.float32
    step_max = BF16_EPS * gold.abs().max().item()
    step_mean = BF16_EPS * gold.abs().mean().item()
    e_hf = (hf_bf16 - gold).abs()
    for what, x in (("engine.score bf16", ref_bf16), ("dense oracle bf16", dense_bf16)):
        e = (x - gold).abs()
        cos = torch.nn.functional.cosine_similarity(x.flatten(), gold.flatten(), dim=0).item()
        print(f"{name} {what}: max {e.max():.4f} mean {e.mean():.5f} cos {cos:.6f} | HF bf16: max {e_hf.max():.4f} "
              f"mean {e_hf.mean():.5f} | bound max {2 * e_hf.max() + step_max:.4f} mean {2 * e_hf.mean() + step_mean:.5f}")
        assert torch.isfinite(x).all()
        assert e.max() <= 2 * e_hf.max() + step_max, f"{name} {what}: max error {e.max():.4f} breaks the rule"
        assert e.mean() <= 2 * e_hf.mean() + step_mean, f"{name} {what}: mean error {e.mean():.5f} breaks the rule"
    # bf16 really ran in bf16 (it is not the fp32 result)
    assert (ref_bf16 - gold).abs().max() > 0


# ----------------------------------------------------------------------------- checkpoints

def _save(m, path: Path, **kw) -> Path:
    m.save_pretrained(str(path), **kw)
    return path


@pytest.fixture(scope="module")
def untied_ckpt(tmp_path_factory):
    cfg = CONFIGS["untied-gqa4"]
    w = random_weights(cfg, seed=11)
    m = hf_model(cfg, w)
    d = _save(m, tmp_path_factory.mktemp("sharded"), max_shard_size="40KB")
    return cfg, m, d


def _copy_dir(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_sharded_checkpoint_loads_and_matches_hf(untied_ckpt):
    cfg, m, d = untied_ckpt
    shards = sorted(d.glob("*.safetensors"))
    assert (d / "model.safetensors.index.json").is_file() and len(shards) >= 3, [p.name for p in shards]
    eng = Engine.from_pretrained(d, block_size=4, num_blocks=32, max_model_len=128)
    mc = eng.model_config
    assert (mc.vocab_size, mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, mc.rope_theta,
            mc.tie_word_embeddings) == (cfg.vocab_size, 8, 2, 8, 10_000.0, False)
    ids = _ids(cfg, 37, seed=5)
    err = (eng.score(ids) - hf_logits(m, ids)).abs().max().item()
    assert err <= FP32_TOL, f"sharded checkpoint: logits differ from HF by {err:.2e}"
    toks = eng.generate([ids[:10]], reference.SamplingParams(max_tokens=5, stop_token_ids=()))[0]
    assert len(toks) == 5


@pytest.mark.parametrize("tied", [False, True])
def test_single_file_checkpoint(tmp_path, tied):
    cfg = CONFIGS["tied-gqa1"] if tied else TINY
    w = random_weights(cfg, seed=2)
    m = hf_model(cfg, w)
    d = _save(m, tmp_path / "ckpt")
    assert (d / "model.safetensors").is_file() and not (d / "model.safetensors.index.json").exists()
    keys = set(load_file(str(d / "model.safetensors")))
    assert ("lm_head.weight" in keys) == (not tied), f"tied={tied}: lm_head in file: {'lm_head.weight' in keys}"
    eng = Engine.from_pretrained(d, block_size=8, num_blocks=16, max_model_len=128)
    assert eng.model_config.tie_word_embeddings == tied
    ids = _ids(cfg, 30, seed=9)
    err = (eng.score(ids) - hf_logits(m, ids)).abs().max().item()
    assert err <= FP32_TOL, f"single-file (tied={tied}) checkpoint: logits differ from HF by {err:.2e}"


def test_tied_sharded_checkpoint(tmp_path):
    cfg = CONFIGS["tied-gqa4-kv1"]
    w = random_weights(cfg, seed=4)
    m = hf_model(cfg, w)
    d = _save(m, tmp_path / "ckpt", max_shard_size="40KB")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]
    eng = Engine.from_pretrained(d, block_size=8, num_blocks=16, max_model_len=128)
    ids = _ids(cfg, 20, seed=1)
    err = (eng.score(ids) - hf_logits(m, ids)).abs().max().item()
    assert err <= FP32_TOL, f"tied sharded checkpoint: logits differ from HF by {err:.2e}"


def _rewrite_tensor(d: Path, name: str, fn) -> None:
    """Apply ``fn(tensors)`` to the shard holding ``name`` and write it back."""
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shard = d / index["weight_map"][name]
    tensors = load_file(str(shard))
    fn(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})


def test_checkpoint_missing_tensor(untied_ckpt, tmp_path):
    d = _copy_dir(untied_ckpt[2], tmp_path / "c")
    _rewrite_tensor(d, "model.layers.1.self_attn.k_norm.weight", lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(ConfigError, match="k_norm"):
        Engine.from_pretrained(d)


def test_checkpoint_missing_lm_head_untied(untied_ckpt, tmp_path):
    d = _copy_dir(untied_ckpt[2], tmp_path / "c")
    _rewrite_tensor(d, "lm_head.weight", lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ConfigError, match="lm_head"):
        Engine.from_pretrained(d)


def test_checkpoint_wrong_shape(untied_ckpt, tmp_path):
    d = _copy_dir(untied_ckpt[2], tmp_path / "c")
    name = "model.layers.0.mlp.up_proj.weight"
    _rewrite_tensor(d, name, lambda t: t.__setitem__(name, t[name][:-1].contiguous()))
    with pytest.raises(ConfigError, match="up_proj"):
        Engine.from_pretrained(d)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3_moe"])
def test_checkpoint_wrong_model_type(untied_ckpt, tmp_path, model_type):
    d = _copy_dir(untied_ckpt[2], tmp_path / "c")
    c = json.loads((d / "config.json").read_text())
    c["model_type"] = model_type
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError, match="qwen3"):
        Engine.from_pretrained(d)


def test_checkpoint_without_weights_or_config(untied_ckpt, tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "config.json").write_text((untied_ckpt[2] / "config.json").read_text())
    with pytest.raises(ConfigError):
        Engine.from_pretrained(d)
    e = tmp_path / "noconfig"
    e.mkdir()
    with pytest.raises(ConfigError):
        Engine.from_pretrained(e)


def test_checkpoint_config_missing_key(untied_ckpt, tmp_path):
    """A config.json without a required field is a bad checkpoint: typed ConfigError, not KeyError."""
    d = _copy_dir(untied_ckpt[2], tmp_path / "c")
    c = json.loads((d / "config.json").read_text())
    del c["hidden_size"]
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError):
        Engine.from_pretrained(d)


def test_checkpoint_missing_shard_file(untied_ckpt, tmp_path):
    """The index names a shard that is not there (an interrupted download): typed ConfigError."""
    d = _copy_dir(untied_ckpt[2], tmp_path / "c")
    sorted(d.glob("model-*.safetensors"))[0].unlink()
    with pytest.raises(ConfigError):
        Engine.from_pretrained(d)
