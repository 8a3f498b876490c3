//! The embedding table mapped from a local checkpoint (only the rows looked up are resident) gives
//! the bits of the table read into memory: the embedded rows and the logits of the tied or untied
//! lm_head, for every tiny model and SmolLM2, at both precisions.

use daisy_conformance::{Model, TINY, smollm2_dir};
use daisy_loader::{DType, MappedBytes};
use daisy_model::{Precision, RawTensor, Source, Stage};

/// The checkpoint, its embedding's map refused (`None`: the table is read) or taken from another
/// tensor's bytes (`Some(name)`: the mutation).
struct Via<'a>(&'a dyn Source, Option<&'static str>);

impl Source for Via<'_> {
    fn read_f32(&self, name: &str) -> daisy_model::Result<(Vec<usize>, Vec<f32>)> {
        self.0.read_f32(name)
    }
    fn read_raw(&self, name: &str) -> daisy_model::Result<Option<RawTensor>> {
        self.0.read_raw(name)
    }
    fn map_raw(&self, name: &str) -> daisy_model::Result<Option<(Vec<usize>, DType, MappedBytes)>> {
        match self.1 {
            Some(instead) if name == "model.embed_tokens.weight" => self.0.map_raw(instead),
            Some(_) => self.0.map_raw(name),
            None => Ok(None),
        }
    }
    fn has(&self, name: &str) -> bool {
        self.0.has(name)
    }
    fn fingerprint(&self) -> [u8; 32] {
        self.0.fingerprint()
    }
}

/// The head of `model` alone (no layers), its embedding mapped and read.
fn heads(model: &Model, precision: Precision) -> (Stage, Stage) {
    let load = |src: &dyn Source| Stage::load(src, &model.config, 0..0, true, precision).unwrap();
    (load(&model.checkpoint), load(&Via(&model.checkpoint, None)))
}

/// Embedded rows of a few ids (the first, the last, repeats) and their logits, as bits.
fn outputs(model: &Model, head: &Stage) -> (Vec<u32>, Vec<u32>) {
    let v = model.config.vocab_size as u32;
    let ids = [0, 1, v / 2, v - 1, 1, v / 3];
    let x = head.embed(&ids, 0).unwrap();
    let logits = head.logits(&x, ids.len()).unwrap();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect();
    (bits(&x), bits(&logits))
}

#[test]
fn a_mapped_embedding_gives_the_bits_of_a_read_one() {
    let mut models: Vec<(String, Model)> = TINY
        .iter()
        .map(|n| (n.to_string(), Model::tiny(n).unwrap()))
        .collect();
    models.push(("smollm2".into(), Model::open(&smollm2_dir()).unwrap()));
    for (name, model) in &models {
        for precision in [Precision::Int8, Precision::F32] {
            let (mapped, read) = heads(model, precision);
            assert!(mapped.is_embedding_mapped(), "{name}: not mapped");
            assert!(!read.is_embedding_mapped(), "{name}: mapped without a map");
            assert_eq!(
                outputs(model, &mapped),
                outputs(model, &read),
                "{name} {precision:?}"
            );
        }
    }
    // The mutation: a table mapped from another tensor's bytes (llama's untied lm_head, of the
    // same shape) does not give these bits.
    let llama = &models[3].1;
    assert!(!llama.config.tie_word_embeddings);
    let load = |src: &dyn Source| Stage::load(src, &llama.config, 0..0, true, Precision::Int8);
    let swapped = load(&Via(&llama.checkpoint, Some("lm_head.weight"))).unwrap();
    assert!(swapped.is_embedding_mapped());
    let read = load(&Via(&llama.checkpoint, None)).unwrap();
    assert_ne!(outputs(llama, &swapped).0, outputs(llama, &read).0);
}
