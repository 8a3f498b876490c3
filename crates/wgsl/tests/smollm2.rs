//! SmolLM2-135M-Instruct at int8 split [10, 10, 10] with every GEMM on the GPU backend equals the
//! unsplit CPU run bit for bit: the hidden state at every hop, the logits, and greedy ids. A mutant
//! kernel injected after the gates makes the GPU run fail its audit instead of answering. The same
//! at int8x2 (two planes, three products per GEMM), whose hops differ from int8's.
//!
//! Needs `target/fixtures/SmolLM2-135M-Instruct` (`cargo xtask fixtures`) and an adapter; without
//! either it skips with a note, except under `CI=true`, where that is a failure.

use std::sync::Arc;

use daisy_gemm_int8::{Backend, CpuBackend};
use daisy_loader::Checkpoint;
use daisy_loader::ModelConfig;
use daisy_model::{Precision, Stage, argmax};
use daisy_wgsl::{DOT4_SHIFT_WGSL, Error, GEMM_WGSL, GpuBackend, Kernel};

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../target/fixtures/SmolLM2-135M-Instruct"
);

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Loads the stages of `split` (layer counts, head first) on `backend`.
fn stages(
    ckpt: &Checkpoint,
    cfg: &ModelConfig,
    split: &[usize],
    backend: &Arc<dyn Backend>,
) -> Vec<Stage> {
    stages_at(ckpt, cfg, split, backend, Precision::Int8)
}

/// [`stages`] at `precision`.
fn stages_at(
    ckpt: &Checkpoint,
    cfg: &ModelConfig,
    split: &[usize],
    backend: &Arc<dyn Backend>,
    precision: Precision,
) -> Vec<Stage> {
    let mut start = 0;
    split
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut s = Stage::load(ckpt, cfg, start..start + n, i == 0, precision).unwrap();
            s.set_backend(Arc::clone(backend));
            start += n;
            s
        })
        .collect()
}

/// One full-window pass: the hidden state after each stage (each hop), then the last row's logits.
fn pass(stages: &[Stage], ids: &[u32]) -> Result<(Vec<Vec<u32>>, Vec<f32>), daisy_model::Error> {
    let mut x = stages[0].embed(ids, 0)?;
    let mut hops = Vec::new();
    for s in stages {
        s.forward(&mut x, ids.len(), 0, None)?;
        hops.push(x.iter().map(|v| v.to_bits()).collect());
    }
    let h = stages[0].config().hidden_size;
    let logits = stages[0].logits(&x[(ids.len() - 1) * h..], 1)?;
    Ok((hops, logits))
}

/// The hidden-state bits at each hop, the first step's logit bits, and the greedy ids.
type Run = (Vec<Vec<u32>>, Vec<u32>, Vec<u32>);

/// Greedy ids over `steps` full-window passes, with the hops of the first pass.
fn run(stages: &[Stage], prompt: &[u32], steps: usize) -> Result<Run, daisy_model::Error> {
    let mut ids = prompt.to_vec();
    let mut first = None;
    for _ in 0..steps {
        let (hops, logits) = pass(stages, &ids)?;
        if first.is_none() {
            first = Some((hops, logits.iter().map(|v| v.to_bits()).collect()));
        }
        ids.push(argmax(&logits));
    }
    let (hops, logits) = first.unwrap_or_default();
    Ok((hops, logits, ids[prompt.len()..].to_vec()))
}

/// `<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n`, as
/// `tokenizers.Tokenizer.from_file` encodes it with the fixture's tokenizer.json.
const PROMPT: [u32; 16] = [
    1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
];

/// The fixture and a gated GPU backend, or `None` (after a note) when either is missing outside CI.
fn fixture_and_gpu() -> Option<(Checkpoint, GpuBackend)> {
    if !std::path::Path::new(MODEL).join("config.json").exists() {
        assert!(!in_ci(), "CI=true and no fixture at {MODEL}");
        eprintln!("skipping: no fixture at {MODEL} (cargo xtask fixtures)");
        return None;
    }
    let gpu = match GpuBackend::new() {
        // Every product on the GPU, none routed to the CPU kernels for its size.
        Ok(mut g) => {
            g.set_cpu_below(0);
            g
        }
        Err(e @ Error::NoAdapter { .. }) => {
            assert!(!in_ci(), "CI=true and no GPU adapter: {e}");
            eprintln!("skipping: {e}");
            return None;
        }
        Err(e) => panic!("the GPU backend did not come up: {e}"),
    };
    eprintln!("adapter: {}", gpu.adapter_name());
    Some((Checkpoint::open(MODEL).unwrap(), gpu))
}

#[test]
fn smollm2_int8x2_split_on_the_gpu_equals_the_unsplit_cpu_run() {
    let Some((ckpt, gpu)) = fixture_and_gpu() else {
        return;
    };
    let cfg = ckpt.config().clone();
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let gpu: Arc<dyn Backend> = Arc::new(gpu);
    let at = |split: &[usize], backend: &Arc<dyn Backend>, precision| {
        run(
            &stages_at(&ckpt, &cfg, split, backend, precision),
            &PROMPT,
            2,
        )
        .unwrap()
    };
    let unsplit = at(&[30], &cpu, Precision::Int8x2);
    let on_gpu = at(&[10, 10, 10], &gpu, Precision::Int8x2);
    // The unsplit run's one hop is the split run's last (after layer 30).
    assert!(
        on_gpu.0.last() == unsplit.0.last(),
        "the GPU's last hop differs from the CPU's"
    );
    assert!(
        on_gpu.1 == unsplit.1,
        "the GPU logits differ from the unsplit CPU run's"
    );
    assert_eq!(
        on_gpu.2, unsplit.2,
        "the GPU greedy ids differ from the CPU's"
    );
    // Mutation: these are two planes' bits, not one's.
    let int8 = at(&[30], &cpu, Precision::Int8);
    assert!(int8.0 != unsplit.0, "int8 gives int8x2's hidden state");
    eprintln!(
        "int8x2 ids {:?} equal on cpu unsplit and gpu split",
        on_gpu.2
    );
}

#[test]
fn smollm2_split_on_the_gpu_equals_the_unsplit_cpu_run() {
    let Some((ckpt, gpu)) = fixture_and_gpu() else {
        return;
    };
    let cfg = ckpt.config().clone();
    let prompt = PROMPT;

    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::new());
    let gpu: Arc<dyn Backend> = Arc::new(gpu);
    let steps = 4;
    let reference = run(&stages(&ckpt, &cfg, &[10, 10, 10], &cpu), &prompt, steps).unwrap();
    let unsplit = run(&stages(&ckpt, &cfg, &[30], &cpu), &prompt, steps).unwrap();
    assert_eq!(
        reference.1, unsplit.1,
        "the split CPU run differs from the unsplit one"
    );
    assert_eq!(reference.2, unsplit.2);

    let on_gpu = run(&stages(&ckpt, &cfg, &[10, 10, 10], &gpu), &prompt, steps).unwrap();
    for (hop, (g, c)) in on_gpu.0.iter().zip(&reference.0).enumerate() {
        assert!(
            g == c,
            "hop {hop}: the GPU hidden state differs from the CPU's"
        );
    }
    assert!(
        on_gpu.1 == reference.1,
        "the GPU logits differ from the CPU's"
    );
    assert_eq!(
        on_gpu.2, reference.2,
        "the GPU greedy ids differ from the CPU's"
    );
    assert_eq!(on_gpu.2, unsplit.2);
    eprintln!(
        "ids {:?} equal on cpu unsplit, cpu split and gpu split",
        on_gpu.2
    );

    // Mutation: a kernel whose `tiled` entry point skips the last K stage, injected after the gates.
    let source = format!("{GEMM_WGSL}\n{DOT4_SHIFT_WGSL}");
    let from = "let ntiles = dims.k16 / KV;";
    assert!(source.contains(from));
    let mut mutant = GpuBackend::ungated(Kernel::Wgsl(
        source.replace(from, "let ntiles = (dims.k16 - 1u) / KV;"),
    ))
    .unwrap();
    mutant.set_cpu_below(0);
    let mutant: Arc<dyn Backend> = Arc::new(mutant);
    let err = run(&stages(&ckpt, &cfg, &[10, 10, 10], &mutant), &prompt, 1).unwrap_err();
    assert!(
        err.to_string().contains("audit"),
        "the mutant failed otherwise: {err}"
    );
}

#[test]
fn a_stage_hands_its_weights_to_the_gpu_at_load() {
    let Some((ckpt, gpu)) = fixture_and_gpu() else {
        return;
    };
    let cfg = ckpt.config().clone();
    let gpu = Arc::new(gpu);
    let backend: Arc<dyn Backend> = gpu.clone();
    let mut stage = Stage::load(&ckpt, &cfg, 0..2, true, Precision::Int8).unwrap();
    stage.set_backend(backend);
    assert_eq!(gpu.cached_bytes(), 0);
    stage.keep_resident().unwrap();
    // Two layers (q/k/v 960 x 576, o 576 x 576, gate/up 3072 x 576, down 576 x 1536) and the tied
    // lm_head (49152 x 576), rows already multiples of 64 bytes.
    let layer = 960 * 576 + 576 * 576 + 3072 * 576 + 576 * 1536;
    let expected = (2 * layer + 49152 * 576) as u64;
    assert_eq!(gpu.cached_bytes(), expected);
    // Kept once: neither a second call nor a pass uploads them again.
    stage.keep_resident().unwrap();
    let mut x = stage.embed(&PROMPT, 0).unwrap();
    stage.forward(&mut x, PROMPT.len(), 0, None).unwrap();
    assert_eq!(gpu.cached_bytes(), expected);
}
