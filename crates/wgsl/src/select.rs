//! `--backend auto|cpu|gpu` (DESIGN §5): `gpu` uses an adapter that passed the gates or fails, never
//! falling back; `cpu` uses `daisy-gemm-int8`'s CPU backend; `auto` takes the faster of the two by
//! measured GEMM rate, falls back to the CPU when no adapter passes, and says which and why.

use std::sync::Arc;

use daisy_gemm_int8::{Backend, CpuBackend, exact_gates, measure_rate};

use crate::backend::GpuBackend;
use crate::device::{AdapterSummary, adapters};
use crate::error::{Error, Result};

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum BackendChoice {
    #[default]
    Auto,
    Cpu,
    Gpu,
}

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cpu => "cpu",
            BackendChoice::Gpu => "gpu",
        })
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<BackendChoice> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            "cpu" => Ok(BackendChoice::Cpu),
            "gpu" => Ok(BackendChoice::Gpu),
            _ => Err(Error::UnknownBackend { got: s.to_owned() }),
        }
    }
}

/// The backend in use and how it was chosen.
#[derive(Clone)]
pub struct Selected {
    /// The gated backend every GEMM goes through.
    pub backend: Arc<dyn Backend>,
    /// The wgpu adapter's name when the GPU was chosen (for the JSON output).
    pub adapter: Option<String>,
    /// One line saying what was chosen and why (print it on stderr for `auto`).
    pub reason: String,
}

impl std::fmt::Debug for Selected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selected")
            .field("backend", &self.backend.name())
            .field("adapter", &self.adapter)
            .field("reason", &self.reason)
            .finish()
    }
}

fn cpu() -> Result<CpuBackend> {
    let cpu = CpuBackend::new();
    exact_gates(&cpu)?;
    Ok(cpu)
}

/// Opens the backend `choice` names; every backend returned has passed `exact_gates`.
pub fn select(choice: BackendChoice) -> Result<Selected> {
    match choice {
        BackendChoice::Cpu => {
            let cpu = cpu()?;
            Ok(Selected {
                reason: format!("backend {} (asked for cpu)", cpu.name()),
                backend: Arc::new(cpu),
                adapter: None,
            })
        }
        BackendChoice::Gpu => {
            let gpu = GpuBackend::new()?;
            Ok(Selected {
                reason: format!(
                    "backend {} (asked for gpu; gates passed)",
                    Backend::name(&gpu)
                ),
                adapter: Some(gpu.adapter_name()),
                backend: Arc::new(gpu),
            })
        }
        BackendChoice::Auto => select_auto(&adapters()),
    }
}

/// `auto` given the adapters an enumeration found (possibly in another process, so that a machine
/// with only a software rasterizer never loads its driver): the CPU when there is no hardware
/// adapter; otherwise the faster of the gated GPU and CPU backends by measured rate.
pub fn select_auto(adapters: &[AdapterSummary]) -> Result<Selected> {
    let cpu = cpu()?;
    if let Some(software) = crate::device::software_only(adapters) {
        return Ok(Selected {
            reason: format!(
                "auto: chose {} because the only adapter, {software}, is a software \
                 rasterizer (slower than the CPU kernels; --backend gpu uses it anyway)",
                cpu.name()
            ),
            backend: Arc::new(cpu),
            adapter: None,
        });
    }
    let gpu = match GpuBackend::new() {
        Ok(gpu) => gpu,
        Err(e) => {
            return Ok(Selected {
                reason: format!(
                    "auto: chose {} because the gpu is unusable: {e}",
                    cpu.name()
                ),
                backend: Arc::new(cpu),
                adapter: None,
            });
        }
    };
    let cpu_rate = measure_rate(&cpu)?;
    // An idle card measured at its idle clock would lose to the CPU by up to its clock's ratio.
    gpu.warm_up(crate::backend::WARM_UP)?;
    let gpu_rate = measure_rate(&gpu)?;
    let rates = format!(
        "{} at {gpu_rate:.1} GOP/s, {} at {cpu_rate:.1} GOP/s",
        Backend::name(&gpu),
        cpu.name()
    );
    if gpu_rate > cpu_rate {
        Ok(Selected {
            reason: format!("auto: chose {} (faster: {rates})", Backend::name(&gpu)),
            adapter: Some(gpu.adapter_name()),
            backend: Arc::new(gpu),
        })
    } else {
        Ok(Selected {
            reason: format!("auto: chose {} (faster: {rates})", cpu.name()),
            backend: Arc::new(cpu),
            adapter: None,
        })
    }
}
