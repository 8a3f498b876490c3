//! The flat parameter shard (issue 18, acceptance 4): a stage whose layers stream from their shard
//! file, two live at a time, gives the resident stage's bits on the full window and on one chunk
//! of the cached path, for every tiny model at every precision and for SmolLM2 in int8; a restart
//! reuses the shard without loading a layer; a resident stage written to its shard and mapped back
//! (the restart of a ring stage) gives the same bits with its arrays borrowed in place; and a shard
//! cut short or changed is refused by name (and removed, so the next start writes it again).

use daisy_conformance::{Model, TINY, smollm2_dir};
use daisy_model::{Precision, Stage};

/// Both stages (resident and streamed) run the same rows, full window then one cached chunk; every
/// output bit is compared.
fn same_bits(model: &Model, resident: &Stage, streamed: &Stage, what: &str) {
    let h = model.config.hidden_size;
    let rows = 9;
    let x: Vec<f32> = (0..rows * h)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.5)
        .collect();
    let (mut a, mut b) = (x.clone(), x.clone());
    resident.forward(&mut a, rows, 0, None).unwrap();
    streamed.forward(&mut b, rows, 0, None).unwrap();
    assert!(
        a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
        "{what}: full window"
    );
    let (mut ca, mut cb) = (resident.new_cache(), streamed.new_cache());
    let (mut a, mut b) = (x.clone(), x);
    resident.forward(&mut a, rows, 0, Some(&mut ca)).unwrap();
    streamed.forward(&mut b, rows, 0, Some(&mut cb)).unwrap();
    let (mut a1, mut b1) = (a[..h].to_vec(), b[..h].to_vec());
    resident.forward(&mut a1, 1, rows, Some(&mut ca)).unwrap();
    streamed.forward(&mut b1, 1, rows, Some(&mut cb)).unwrap();
    assert!(
        a.iter()
            .chain(&a1)
            .zip(b.iter().chain(&b1))
            .all(|(p, q)| p.to_bits() == q.to_bits()),
        "{what}: a cached chunk and the step after it"
    );
}

/// `layers` of `model` (no head) mapped from the shard at `path`, if there is one for them.
fn mapped(
    model: &Model,
    layers: std::ops::Range<usize>,
    precision: Precision,
    path: &std::path::Path,
) -> Option<Stage> {
    Stage::load_mapped(
        &model.checkpoint,
        &model.config,
        layers,
        false,
        precision,
        path,
    )
    .unwrap()
}

#[test]
fn a_streamed_stage_equals_the_resident_one() {
    let dir = tempfile::tempdir().unwrap();
    for name in TINY {
        let model = Model::tiny(name).unwrap();
        let n = model.config.num_layers;
        for precision in Precision::ALL {
            let what = format!("{name} {}", precision.name());
            let resident = model.stage(1..n, false, precision).unwrap();
            let path = dir
                .path()
                .join(format!("{name}-{}.shard", precision.name()));
            let load = || {
                Stage::load_streamed(
                    &model.checkpoint,
                    &model.config,
                    1..n,
                    false,
                    precision,
                    &path,
                )
                .unwrap()
            };
            let (streamed, reused) = load();
            assert!(!reused && streamed.is_streamed());
            same_bits(&model, &resident, &streamed, &what);
            // A restart: the shard is there, so it is used as it is.
            let (again, reused) = load();
            assert!(reused, "{what}: the shard was written again");
            same_bits(&model, &resident, &again, &what);
            // The mutation: a stage of other layers is not these bits.
            let other = model.stage(0..n - 1, false, precision).unwrap();
            let h = model.config.hidden_size;
            let mut p: Vec<f32> = (0..3 * h).map(|i| (i % 17) as f32 / 17.0).collect();
            let mut q = p.clone();
            other.forward(&mut p, 3, 0, None).unwrap();
            again.forward(&mut q, 3, 0, None).unwrap();
            assert_ne!(p, q, "{what}: other layers gave the same bits");
        }
    }
}

#[test]
fn a_mapped_stage_equals_the_resident_one() {
    let dir = tempfile::tempdir().unwrap();
    for name in TINY {
        let model = Model::tiny(name).unwrap();
        let n = model.config.num_layers;
        for precision in Precision::ALL {
            let what = format!("{name} {}", precision.name());
            let path = dir
                .path()
                .join(format!("{name}-{}.shard", precision.name()));
            let map = || mapped(&model, 1..n, precision, &path);
            assert!(map().is_none(), "{what}: mapped before it was written");
            let resident = model.stage(1..n, false, precision).unwrap();
            resident.write_shard(&path).unwrap();
            let mapped = map().expect("the shard just written");
            assert!(mapped.is_mapped() && !resident.is_mapped());
            same_bits(&model, &resident, &mapped, &what);
            // The mutation: a shard of other layers is not mapped as these.
            let other = model.stage(0..n - 1, false, precision).unwrap();
            other.write_shard(&path).unwrap();
            assert!(map().is_none(), "{what}: another range's shard was mapped");
        }
    }
}

#[test]
fn smollm2_streams_its_layers_bit_for_bit() {
    let model = Model::open(&smollm2_dir()).expect("SmolLM2 fixture");
    let dir = tempfile::tempdir().unwrap();
    let resident = model.stage(10..20, false, Precision::Int8).unwrap();
    let (streamed, _) = Stage::load_streamed(
        &model.checkpoint,
        &model.config,
        10..20,
        false,
        Precision::Int8,
        &dir.path().join("smollm2.shard"),
    )
    .unwrap();
    same_bits(&model, &resident, &streamed, "SmolLM2 layers 10..20");
    let path = dir.path().join("smollm2-resident.shard");
    resident.write_shard(&path).unwrap();
    let again = mapped(&model, 10..20, Precision::Int8, &path).expect("the shard just written");
    same_bits(&model, &resident, &again, "SmolLM2 layers 10..20, mapped");
}

#[test]
fn a_shard_cut_short_or_changed_is_refused() {
    let model = Model::tiny("llama").unwrap();
    let n = model.config.num_layers;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama.shard");
    let load = |path: &std::path::Path| {
        Stage::load_streamed(
            &model.checkpoint,
            &model.config,
            0..n,
            false,
            Precision::Int8,
            path,
        )
    };
    let (stage, _) = load(&path).unwrap();
    drop(stage);
    let bytes = std::fs::read(&path).unwrap();
    // Cut short (a crash mid-write, had it not been renamed whole): not read as a shard; it is
    // written again, and the new one is whole.
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    let (stage, reused) = load(&path).unwrap();
    assert!(!reused, "a truncated shard was used");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    drop(stage);
    // One byte changed inside a layer: refused by its hash on first use.
    let mut changed = bytes.clone();
    let at = changed.len() - 100;
    changed[at] ^= 1;
    std::fs::write(&path, &changed).unwrap();
    let (stage, reused) = load(&path).unwrap();
    assert!(reused);
    let h = model.config.hidden_size;
    let mut x = vec![0.25f32; 2 * h];
    let e = stage.forward(&mut x, 2, 0, None).unwrap_err().to_string();
    assert!(e.contains("does not match its SHA-256"), "{e}");
    assert!(!path.exists(), "a shard that failed its hash was kept");
    // The same, mapped by a resident stage: refused on first use, and removed.
    std::fs::write(&path, &changed).unwrap();
    let map = mapped(&model, 0..n, Precision::Int8, &path)
        .expect("a shard whose header and size agree is mapped");
    let e = map.forward(&mut x, 2, 0, None).unwrap_err().to_string();
    assert!(e.contains("does not match its SHA-256"), "{e}");
    assert!(!path.exists(), "a shard that failed its hash was kept");
    // Cut short: not mapped at all.
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    let cut = mapped(&model, 0..n, Precision::Int8, &path);
    assert!(cut.is_none(), "a truncated shard was mapped");
}
