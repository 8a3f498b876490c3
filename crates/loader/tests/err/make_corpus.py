#!/usr/bin/env python3
"""Writes the refusal corpus: one folder per case, each a small checkpoint with one fault, and an
`expect` file holding a fragment the one-line error must contain. `ok_base` (safetensors) and
`ok_gguf` are the unmutated bases; every other case is one of them with a single change.

Standard library only. Run from anywhere: python3 crates/loader/tests/err/make_corpus.py
"""

import json
import math
import shutil
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent

# A tiny llama: hidden 8, 1 layer, 2 heads of 4, 1 kv head, intermediate 16, vocab 8, tied.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 16,
    "vocab_size": 8,
    "max_position_embeddings": 32,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

SHAPES = [
    ("model.embed_tokens.weight", [8, 8]),
    ("model.norm.weight", [8]),
    ("model.layers.0.input_layernorm.weight", [8]),
    ("model.layers.0.self_attn.q_proj.weight", [8, 8]),
    ("model.layers.0.self_attn.k_proj.weight", [4, 8]),
    ("model.layers.0.self_attn.v_proj.weight", [4, 8]),
    ("model.layers.0.self_attn.o_proj.weight", [8, 8]),
    ("model.layers.0.post_attention_layernorm.weight", [8]),
    ("model.layers.0.mlp.gate_proj.weight", [16, 8]),
    ("model.layers.0.mlp.up_proj.weight", [16, 8]),
    ("model.layers.0.mlp.down_proj.weight", [8, 16]),
]


def values(n, seed):
    return [((i * 37 + seed * 11) % 17 - 8) / 16.0 for i in range(n)]


def tensors(shapes=SHAPES):
    out = []
    for k, (name, shape) in enumerate(shapes):
        n = math.prod(shape)
        out.append({"name": name, "dtype": "F32", "shape": shape,
                    "data": struct.pack(f"<{n}f", *values(n, k))})
    return out


def safetensors(ts, header_edit=None):
    header, offset, data = {"__metadata__": {"format": "pt"}}, 0, b""
    for t in ts:
        header[t["name"]] = {"dtype": t["dtype"], "shape": t["shape"],
                             "data_offsets": [offset, offset + len(t["data"])]}
        offset += len(t["data"])
        data += t["data"]
    if header_edit:
        header_edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def case(name, expect, config=CONFIG, model=None, files=None):
    d = HERE / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    (d / "expect").write_text(expect + "\n")
    if config is not None:
        (d / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    if model is not None:
        (d / "model.safetensors").write_bytes(model)
    for fname, data in (files or {}).items():
        (d / fname).write_bytes(data)


# --- GGUF -------------------------------------------------------------------------------------

def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, kind, value):
    out = gguf_string(key) + struct.pack("<I", kind)
    if kind == 4:
        out += struct.pack("<I", value)
    elif kind == 6:
        out += struct.pack("<f", value)
    elif kind == 8:
        out += gguf_string(value)
    return out


GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "model.layers.0.input_layernorm.weight": "blk.0.attn_norm.weight",
    "model.layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "model.layers.0.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "model.layers.0.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "model.layers.0.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "model.layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "model.layers.0.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "model.layers.0.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "model.layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}


def gguf(arch="llama", type_of=None, magic=b"GGUF"):
    """A GGUF v3 file of the tiny model, all tensors F32 unless `type_of` gives (type id, bytes)."""
    kvs = [
        gguf_kv("general.architecture", 8, arch),
        gguf_kv(f"{arch}.block_count", 4, 1),
        gguf_kv(f"{arch}.context_length", 4, 32),
        gguf_kv(f"{arch}.embedding_length", 4, 8),
        gguf_kv(f"{arch}.feed_forward_length", 4, 16),
        gguf_kv(f"{arch}.attention.head_count", 4, 2),
        gguf_kv(f"{arch}.attention.head_count_kv", 4, 1),
        gguf_kv(f"{arch}.rope.freq_base", 6, 10000.0),
        gguf_kv(f"{arch}.attention.layer_norm_rms_epsilon", 6, 1e-5),
        gguf_kv(f"{arch}.vocab_size", 4, 8),
    ]
    infos, blobs, offset = b"", [], 0
    for t in tensors():
        name = GGUF_NAMES[t["name"]]
        ty, data = (0, t["data"])
        if type_of and name in type_of:
            ty, data = type_of[name]
        dims = list(reversed(t["shape"]))
        infos += gguf_string(name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", ty, offset)
        blobs.append(data + b"\0" * (-len(data) % 32))
        offset += len(blobs[-1])
    head = magic + struct.pack("<IQQ", 3, len(tensors()), len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * (-len(head) % 32)
    return head + b"".join(blobs)


def main():
    for d in HERE.iterdir():
        if d.is_dir():
            shutil.rmtree(d)
    good = safetensors(tensors())
    case("ok_base", "", model=good)

    case("truncated_header", "shorter than the 8-byte header length", model=good[:5])
    case("header_past_eof", "runs past the end of the file", model=struct.pack("<Q", 1 << 20) + good[8:200])
    case("header_too_large", "exceeds the limit", model=struct.pack("<Q", 200_000_000) + good[8:])
    n = struct.unpack("<Q", good[:8])[0]
    case("header_not_json", "header is not a JSON object",
         model=struct.pack("<Q", n) + good[8:8 + n // 2] + b" " * (n - n // 2) + good[8 + n:])

    def overlap(h):
        h["model.layers.0.self_attn.v_proj.weight"]["data_offsets"] = \
            list(h["model.layers.0.self_attn.k_proj.weight"]["data_offsets"])
    case("overlapping_offsets", "overlaps tensor", model=safetensors(tensors(), overlap))

    def past_end(h):
        s, e = h["model.layers.0.mlp.down_proj.weight"]["data_offsets"]
        h["model.layers.0.mlp.down_proj.weight"]["data_offsets"] = [s + 64, e + 64]
    case("offsets_past_end", "run past the end of the data", model=safetensors(tensors(), past_end))

    def wrong_shape(h):
        h["model.layers.0.mlp.up_proj.weight"]["shape"] = [16, 9]
    case("shape_size_mismatch", "needs 576 bytes but data_offsets", model=safetensors(tensors(), wrong_shape))

    ts = tensors()
    ts[3] = dict(ts[3], dtype="F8_E4M3", shape=[8, 32])  # same 256 bytes, as 8-bit floats
    case("dtype_f8_e4m3", "unsupported dtype `F8_E4M3`", model=safetensors(ts))
    ts = tensors()
    ts[3] = dict(ts[3], dtype="F12")
    case("dtype_unknown", "unknown dtype `F12`", model=safetensors(ts))

    ts = tensors()
    q = bytearray(ts[3]["data"])
    q[4 * 13:4 * 14] = struct.pack("<f", float("nan"))
    ts[3] = dict(ts[3], data=bytes(q))
    case("non_finite_nan", "`model.layers.0.self_attn.q_proj.weight` has a non-finite value NaN at index 13",
         model=safetensors(ts))
    ts = tensors()
    ts[9] = dict(ts[9], dtype="BF16", data=struct.pack("<128H", *([0x3f80] * 5 + [0xff80] + [0] * 122)))
    case("non_finite_bf16_inf", "`model.layers.0.mlp.up_proj.weight` has a non-finite value -inf at index 5",
         model=safetensors(ts))

    case("missing_tensor", "missing tensor `model.layers.0.mlp.up_proj.weight`",
         model=safetensors([t for t in tensors() if t["name"] != "model.layers.0.mlp.up_proj.weight"]))
    ts = tensors([(n, [8, 8] if n.endswith("k_proj.weight") else s) for n, s in SHAPES])
    case("shape_vs_config", "`model.layers.0.self_attn.k_proj.weight` has shape [8, 8], expected [4, 8]",
         model=safetensors(ts))
    ts = tensors() + tensors([("model.layers.0.self_attn.q_norm.weight", [4])])
    case("unexpected_tensor", "unexpected tensor `model.layers.0.self_attn.q_norm.weight`", model=safetensors(ts))

    case("model_type_phi3", "unsupported model_type `phi3`", config=dict(CONFIG, model_type="phi3"), model=good)
    case("rope_scaling_yarn", "unsupported rope scaling `rope_scaling` {\"factor\":4.0,\"rope_type\":\"yarn\"}",
         config=dict(CONFIG, rope_scaling={"rope_type": "yarn", "factor": 4.0}), model=good)
    case("rope_parameters_llama3", "unsupported rope scaling `rope_parameters.rope_type` \"llama3\"",
         config=dict(CONFIG, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0}), model=good)
    case("activation_gelu", "unsupported activation `gelu` for llama", config=dict(CONFIG, hidden_act="gelu"),
         model=good)
    case("gpt2_activation_relu", "unsupported activation `relu` for gpt2",
         config={"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 16,
                 "vocab_size": 8, "activation_function": "relu"}, model=good)
    case("no_config", "no config.json", config=None, model=good)
    case("no_weights", "no model.safetensors", model=None)

    index = {"metadata": {}, "weight_map": {t["name"]: "model-00001-of-00002.safetensors" for t in tensors()}}
    index["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors"
    ts = tensors()
    case("shard_missing", "no model-00002-of-00002.safetensors",
         files={"model.safetensors.index.json": json.dumps(index).encode(),
                "model-00001-of-00002.safetensors": safetensors(ts)})

    case("ok_gguf", "", config=None, files={"model.gguf": gguf()})
    case("gguf_q5_k", "tensor `blk.0.ffn_up.weight` has unsupported gguf type Q5_K (type 13)", config=None,
         files={"model.gguf": gguf(type_of={"blk.0.ffn_up.weight": (13, b"\0" * 176)})})
    case("gguf_bad_magic", "magic", config=None, files={"model.gguf": gguf(magic=b"GGUX")})
    case("gguf_arch_phi3", "unsupported model_type `phi3`", config=None, files={"model.gguf": gguf(arch="phi3")})
    case("gguf_truncated", "truncated", config=None, files={"model.gguf": gguf()[:300]})


if __name__ == "__main__":
    main()
