//! Instance, adapter and device from the environment (`WGPU_BACKEND`, `WGPU_ADAPTER_NAME`,
//! `WGPU_POWER_PREF`), and the error sink that turns wgpu's uncaptured errors into `Error`s.

use std::sync::{Arc, Mutex, PoisonError};

use crate::error::{Error, Result};

/// An open device with the facts the kernels need about it (a clone is the same device).
#[derive(Clone)]
pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    /// Whether the instance implements WGSL's `packed_4x8_integer_dot_product` extension.
    pub(crate) packed_dot: bool,
    /// Whether the device was opened with `SHADER_F64` (64-bit floats in shaders; `floats`).
    pub(crate) f64: bool,
    /// The largest storage binding (and buffer) the device accepts, in bytes.
    pub(crate) max_binding: u64,
    /// Whether dispatches are timed on the GPU (`DAISY_GPU_TIMESTAMPS=1` and an adapter with
    /// timestamp queries inside passes): the GPU stage's per-kernel profile.
    pub(crate) timestamps: bool,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Gpu {
    /// Opens the adapter the environment names, or the default one for `WGPU_BACKEND`.
    pub(crate) fn open() -> Result<Gpu> {
        pollster::block_on(open_async())
    }

    /// The adapter's name as the JSON output and the logs show it.
    pub(crate) fn adapter_name(&self) -> String {
        format!(
            "{} ({:?}, {})",
            self.info.name, self.info.backend, self.info.driver
        )
    }

    /// Returns the errors wgpu reported since the last call, as one `Error`.
    pub(crate) fn take_error(&self) -> Result<()> {
        let mut errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        if errors.is_empty() {
            return Ok(());
        }
        let message = errors.join("; ");
        errors.clear();
        Err(Error::Wgpu {
            adapter: self.adapter_name(),
            message,
        })
    }
}

fn env_or_unset(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| "<unset>".to_owned())
}

fn no_adapter(reason: String) -> Error {
    Error::NoAdapter {
        backend: env_or_unset("WGPU_BACKEND"),
        name: env_or_unset("WGPU_ADAPTER_NAME"),
        reason,
    }
}

/// One adapter as enumeration reports it (no device opened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    /// The adapter's name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// Whether it is a software rasterizer (wgpu's `DeviceType::Cpu`: llvmpipe, SwiftShader).
    pub software: bool,
}

/// Every adapter the environment offers (`WGPU_BACKEND` honoured). No device is opened, but the
/// graphics drivers are loaded into this process, which costs resident memory for its lifetime
/// (~50 MB for Mesa's lavapipe): `node` runs this in a child process for `--backend auto`.
pub fn adapters() -> Vec<AdapterSummary> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.flags = wgpu::InstanceFlags::empty();
    let desc = desc.with_env();
    let backends = desc.backends;
    let instance = wgpu::Instance::new(desc);
    pollster::block_on(instance.enumerate_adapters(backends))
        .iter()
        .map(|a| {
            let info = a.get_info();
            AdapterSummary {
                name: info.name,
                software: info.device_type == wgpu::DeviceType::Cpu,
            }
        })
        .collect()
}

/// When every adapter in `adapters` is a software rasterizer, the name of the first; `None` when
/// there is a hardware adapter, or none at all. `WGPU_ADAPTER_NAME` names an adapter on purpose, so
/// with it set this answers `None`.
pub(crate) fn software_only(adapters: &[AdapterSummary]) -> Option<String> {
    if std::env::var_os("WGPU_ADAPTER_NAME").is_some() || adapters.iter().any(|a| !a.software) {
        return None;
    }
    adapters.first().map(|a| a.name.clone())
}

async fn open_async() -> Result<Gpu> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.flags = wgpu::InstanceFlags::empty();
    let desc = desc.with_env();
    let backends = desc.backends;
    let instance = wgpu::Instance::new(desc);
    let packed_dot = instance
        .wgsl_language_features()
        .contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct);

    let adapter = match std::env::var("WGPU_ADAPTER_NAME") {
        Ok(wanted) => {
            let wanted = wanted.to_lowercase();
            let adapters = instance.enumerate_adapters(backends).await;
            let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
            adapters
                .into_iter()
                .find(|a| a.get_info().name.to_lowercase().contains(&wanted))
                .ok_or_else(|| no_adapter(format!("none of {names:?} matches the name")))?
        }
        Err(_) => instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::from_env()
                    .unwrap_or(wgpu::PowerPreference::HighPerformance),
                force_fallback_adapter: false,
                compatible_surface: None,
                ..Default::default()
            })
            .await
            .map_err(|e| no_adapter(e.to_string()))?,
    };
    let info = adapter.get_info();
    let limits = adapter.limits();
    // 64-bit floats where the adapter has them (the contract's f64 steps on the device, `floats`).
    let mut features = adapter.features() & wgpu::Features::SHADER_F64;
    // GPU timestamps around each dispatch, only when asked for (a profile, not a result).
    let timed = wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
    let timestamps = std::env::var("DAISY_GPU_TIMESTAMPS").is_ok_and(|v| v == "1")
        && adapter.features().contains(timed);
    if timestamps {
        features |= timed;
    }
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("daisy-wgsl"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        })
        .await
        .map_err(|e| Error::RequestDevice {
            adapter: info.name.clone(),
            reason: e.to_string(),
        })?;

    let errors = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&errors);
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        sink.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e.to_string());
    }));
    let sink = Arc::clone(&errors);
    device.set_device_lost_callback(move |reason, message| {
        sink.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(format!("device lost ({reason:?}): {message}"));
    });

    Ok(Gpu {
        device,
        queue,
        info,
        packed_dot,
        f64: features.contains(wgpu::Features::SHADER_F64),
        max_binding: limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size),
        timestamps,
        errors,
    })
}
