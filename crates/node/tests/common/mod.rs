//! Helpers more than one test binary uses.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// Each tensor's byte length in a `.safetensors` file, read from its header.
pub(crate) fn tensor_bytes(file: &Path) -> BTreeMap<String, u64> {
    let mut f = std::fs::File::open(file).unwrap();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).unwrap();
    let mut header = vec![0u8; u64::from_le_bytes(len) as usize];
    f.read_exact(&mut header).unwrap();
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).unwrap();
    header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(k, v)| {
            let o = v["data_offsets"].as_array().unwrap();
            (k, o[1].as_u64().unwrap() - o[0].as_u64().unwrap())
        })
        .collect()
}

/// The bytes a stage's opening reads: the header length, the header and `config.json`.
pub(crate) fn open_bytes(model: &Path) -> u64 {
    let mut f = std::fs::File::open(model.join("model.safetensors")).unwrap();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).unwrap();
    let config = std::fs::metadata(model.join("config.json")).unwrap().len();
    8 + u64::from_le_bytes(len) + config
}

/// The layer a tensor name belongs to (`model.layers.N.` or GPT-2's `h.N.`), `None` for the head's.
pub(crate) fn layer_of(name: &str) -> Option<usize> {
    let rest = name
        .strip_prefix("model.layers.")
        .or_else(|| name.strip_prefix("transformer.h."))
        .or_else(|| name.strip_prefix("h."))?;
    rest.split('.').next()?.parse().ok()
}
