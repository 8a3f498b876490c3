//! The backend every int8 product of a run goes through, admitted by the exact gates.

use std::sync::Arc;

use daisy_gemm_int8::Backend;
use daisy_wgsl::{AdapterSummary, BackendChoice};

use crate::error::{Context, Result};

/// The chosen backend, the wgpu adapter when it is the GPU, and one line saying why.
pub struct ChosenBackend {
    pub backend: Arc<dyn Backend>,
    pub adapter: Option<String>,
    pub reason: String,
}

/// The backend `choice` names: `gpu` never falls back, `cpu` is the CPU kernels, `auto` takes the
/// faster by measured GEMM rate. For `auto`, `adapters` is the adapter list when the caller
/// enumerated it elsewhere (the node does so in a child process, so a software rasterizer's driver
/// never enters the node); `None` enumerates here.
pub fn choose_backend(
    choice: BackendChoice,
    adapters: Option<&[AdapterSummary]>,
) -> Result<ChosenBackend> {
    let selected = match (choice, adapters) {
        (BackendChoice::Auto, Some(list)) => daisy_wgsl::select_auto(list),
        _ => daisy_wgsl::select(choice),
    }
    .context(|| format!("--backend {choice}"))?;
    Ok(ChosenBackend {
        backend: selected.backend,
        adapter: selected.adapter,
        reason: selected.reason,
    })
}
