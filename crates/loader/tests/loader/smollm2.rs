//! The SmolLM2-135M-Instruct Q4_1 GGUF (built by `cargo xtask fixtures`) against the independent
//! golden of the Python `gguf` package: SHA-256 of each tensor's dequantized f32 values in file
//! order, before un-permuting; and the converted Hugging Face folder against the GGUF.

use std::collections::BTreeMap;
use std::path::PathBuf;

use daisy_loader::{ByteSource, Checkpoint, FileSource, GgmlType, widen_f16};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::root;

fn fixture(name: &str) -> PathBuf {
    let path = root().join("target/fixtures").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask fixtures` first",
        path.display()
    );
    path
}

fn gguf() -> Checkpoint {
    Checkpoint::open(&fixture("SmolLM2-135M-Instruct.Q4_1.gguf").to_string_lossy()).unwrap()
}

fn golden() -> BTreeMap<String, String> {
    let text =
        std::fs::read_to_string(root().join("fixtures/goldens/gguf_dequant_sha256.json")).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    json["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v["sha256"].as_str().unwrap().to_string()))
        .collect()
}

fn sha(values: &[f32]) -> String {
    let mut h = Sha256::new();
    for v in values {
        h.update(v.to_le_bytes());
    }
    hex::encode(h.finalize())
}

#[test]
fn dequantization_matches_the_gguf_package_for_all_272_tensors() {
    let ckpt = gguf();
    let golden = golden();
    assert_eq!(golden.len(), 272);
    assert_eq!(ckpt.tensors().count(), 272);
    let mut mismatches = Vec::new();
    for t in ckpt.tensors() {
        let ours = sha(&ckpt.read_gguf_dequantized(&t.name).unwrap());
        match golden.get(&t.stored_name) {
            Some(want) if *want == ours => {}
            other => mismatches.push(format!(
                "{} ({}): {other:?} vs {ours}",
                t.stored_name, t.name
            )),
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    let types: Vec<GgmlType> = ckpt.tensors().filter_map(|t| t.gguf_type).collect();
    assert_eq!(types.iter().filter(|t| **t == GgmlType::Q4_1).count(), 210);
    assert_eq!(types.iter().filter(|t| **t == GgmlType::F32).count(), 61);
    assert_eq!(types.iter().filter(|t| **t == GgmlType::Q8_0).count(), 1);
}

/// The ways a Q4_1 reader can go wrong, each of which the golden must catch. (An FMA is not among
/// them for this file: `d` is an f16 widened to f32 and the nibble has 4 bits, so `q·d` is exact
/// and `(q·d) + m` rounds once either way.)
#[derive(Clone, Copy, PartialEq)]
enum Q41 {
    Reference,
    InterleavedNibbles,
    SignedNibbles,
    SwappedScaleAndMin,
}

#[test]
fn q4_1_mutations_are_caught_by_the_golden() {
    let ckpt = gguf();
    let golden = golden();
    let t = ckpt.tensor("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!(t.gguf_type, Some(GgmlType::Q4_1));
    let file = FileSource::open(&fixture("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let bytes = file.read_at(t.offset, t.byte_len as usize).unwrap();
    let f16 = |b: &[u8], i: usize| widen_f16(u16::from_le_bytes([b[i], b[i + 1]]));
    let dequant = |how: Q41| -> Vec<f32> {
        let mut out = Vec::new();
        for b in bytes.chunks_exact(20) {
            let (mut d, mut m) = (f16(b, 0), f16(b, 2));
            if how == Q41::SwappedScaleAndMin {
                std::mem::swap(&mut d, &mut m);
            }
            let one = |q: u8| {
                let q = if how == Q41::SignedNibbles {
                    f32::from(q as i8 - 8)
                } else {
                    f32::from(q)
                };
                q * d + m
            };
            if how == Q41::InterleavedNibbles {
                out.extend(b[4..].iter().flat_map(|&q| [one(q & 0x0f), one(q >> 4)]));
            } else {
                out.extend(b[4..].iter().map(|&q| one(q & 0x0f)));
                out.extend(b[4..].iter().map(|&q| one(q >> 4)));
            }
        }
        out
    };
    let want = &golden[&t.stored_name];
    assert_eq!(
        &sha(&dequant(Q41::Reference)),
        want,
        "the reference formula matches"
    );
    for how in [
        Q41::InterleavedNibbles,
        Q41::SignedNibbles,
        Q41::SwappedScaleAndMin,
    ] {
        assert_ne!(&sha(&dequant(how)), want, "a mutated reader must not match");
    }
}

#[test]
fn the_synthesized_tokenizer_has_the_upstream_shape() {
    let ckpt = gguf();
    let json: Value = serde_json::from_slice(&ckpt.tokenizer_json().unwrap()).unwrap();
    assert_eq!(json["model"]["vocab"].as_object().unwrap().len(), 49152);
    assert_eq!(json["model"]["merges"].as_array().unwrap().len(), 48900);
    let added = json["added_tokens"].as_array().unwrap();
    assert_eq!(added.len(), 17);
    assert!(added.iter().all(|t| t["special"] == true));
    assert_eq!(added[1]["content"], "<|im_start|>");
    assert_eq!(added[2]["content"], "<|im_end|>");
    let pre = &json["pre_tokenizer"]["pretokenizers"];
    assert_eq!(pre[0]["type"], "Digits");
    assert_eq!(pre[0]["individual_digits"], true);
    assert_eq!(pre[1]["type"], "ByteLevel");
    assert_eq!(pre[1]["add_prefix_space"], false);
    let config: Value =
        serde_json::from_slice(&ckpt.tokenizer_config_json().unwrap().unwrap()).unwrap();
    assert_eq!(config["bos_token"], "<|im_start|>");
    assert_eq!(config["eos_token"], "<|im_end|>");
    assert!(
        config["chat_template"]
            .as_str()
            .unwrap()
            .contains("<|im_start|>")
    );
}

#[test]
fn the_converted_folder_describes_the_same_model() {
    let g = gguf();
    let hf = Checkpoint::open(&fixture("SmolLM2-135M-Instruct").to_string_lossy()).unwrap();
    assert_eq!(g.config(), hf.config());
    let (cfg, names) = (g.config(), |c: &Checkpoint| {
        let mut v: Vec<(String, Vec<usize>)> = c
            .tensors()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        v.sort();
        v
    });
    assert_eq!(names(&g), names(&hf));
    assert_eq!(
        (
            cfg.num_layers,
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads
        ),
        (30, 576, 9, 3)
    );
    assert!(cfg.tie_word_embeddings);
    assert_ne!(g.fingerprint(), hf.fingerprint());
    assert_eq!(g.tokenizer_json().unwrap(), hf.tokenizer_json().unwrap());
}
