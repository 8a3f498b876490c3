//! The WGSL GEMM kernel: its sources (`gemm.wgsl` plus one `dot4` variant), the compute pipeline,
//! and the dispatch of one T x N tile grid with read-back of the i32 accumulators.

use std::sync::mpsc;

use crate::backend::GpuWeights;
use crate::device::Gpu;
use crate::error::{Error, Result};

/// The kernel body: tiled i32 GEMM over int8 packed four to a u32; needs a `dot4` function.
pub const GEMM_WGSL: &str = include_str!("gemm.wgsl");
/// `dot4` through `dot4I8Packed` (WGSL's `packed_4x8_integer_dot_product` extension).
pub const DOT4_PACKED_WGSL: &str = include_str!("dot4_packed.wgsl");
/// `dot4` by shifting each byte to the top of an i32 and sign-extending it back.
pub const DOT4_SHIFT_WGSL: &str = include_str!("dot4_shift.wgsl");

/// Output rows (T) per workgroup; must match `TM` in `gemm.wgsl`.
const TILE_T: usize = 64;
/// Output columns (N) per workgroup; must match `TN` in `gemm.wgsl`.
const TILE_N: usize = 64;

/// Which WGSL program computes the 4 x int8 dot products.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kernel {
    /// `dot4I8Packed` where the instance implements it, shift-and-sign-extend otherwise.
    Auto,
    /// `dot4I8Packed` (fails to build where the extension is missing).
    Packed,
    /// Shift-and-sign-extend, on every adapter.
    ShiftExtend,
    /// A complete WGSL program with the same bindings and tiling (tests build mutants this way).
    Wgsl(String),
}

impl Kernel {
    /// The WGSL source this kernel compiles on an instance with or without `dot4I8Packed`.
    pub fn source(&self, packed_dot: bool) -> String {
        match self {
            Kernel::Auto if packed_dot => format!("{GEMM_WGSL}\n{DOT4_PACKED_WGSL}"),
            Kernel::Packed => format!("{GEMM_WGSL}\n{DOT4_PACKED_WGSL}"),
            Kernel::Auto | Kernel::ShiftExtend => format!("{GEMM_WGSL}\n{DOT4_SHIFT_WGSL}"),
            Kernel::Wgsl(source) => source.clone(),
        }
    }

    /// A short name for logs and the adapter description.
    pub fn name(&self, packed_dot: bool) -> &'static str {
        match self {
            Kernel::Auto if packed_dot => "dot4I8Packed",
            Kernel::Packed => "dot4I8Packed",
            Kernel::Auto | Kernel::ShiftExtend => "shift-extend",
            Kernel::Wgsl(_) => "custom",
        }
    }
}

/// The compiled pipeline and its bind group layout.
pub(crate) struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

fn storage_entry(binding: u32, read_only: bool) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

impl Pipeline {
    pub(crate) fn new(gpu: &Gpu, source: &str) -> Result<Pipeline> {
        let device = &gpu.device;
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("gemm-int8"),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("gemm-int8"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                },
                storage_entry(1, true),
                storage_entry(2, true),
                storage_entry(3, false),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("gemm-int8"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("gemm-int8"),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        gpu.take_error()?;
        Ok(Pipeline { pipeline, layout })
    }
}

/// Number of u32 words in a row of `k` int8 values.
pub(crate) fn words(k: usize) -> usize {
    k.div_ceil(4)
}

/// Packs a row-major `rows x k` int8 matrix into `rows x words(k)` u32 (as bytes), zero-padded.
pub(crate) fn pack_rows(m: &[i8], rows: usize, k: usize) -> Vec<u8> {
    let k4 = words(k);
    let mut packed = vec![0u8; rows * k4 * 4];
    for (dst, src) in packed.chunks_exact_mut(k4 * 4).zip(m.chunks_exact(k)) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s as u8;
        }
    }
    packed
}

/// Buffers reused across calls, grown on demand.
#[derive(Default)]
pub(crate) struct Scratch {
    bufs: Option<ScratchBufs>,
}

struct ScratchBufs {
    dims: wgpu::Buffer,
    a: wgpu::Buffer,
    out: wgpu::Buffer,
    readback: wgpu::Buffer,
    a_cap: u64,
    out_cap: u64,
}

impl Scratch {
    fn ensure(&mut self, gpu: &Gpu, a_bytes: u64, out_bytes: u64) -> &ScratchBufs {
        let bufs = match self.bufs.take() {
            Some(b) if b.a_cap >= a_bytes && b.out_cap >= out_bytes => b,
            old => {
                let a_cap = a_bytes.max(old.as_ref().map_or(0, |b| b.a_cap));
                let out_cap = out_bytes.max(old.as_ref().map_or(0, |b| b.out_cap));
                let buffer = |label, size, usage| {
                    gpu.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(label),
                        size,
                        usage,
                        mapped_at_creation: false,
                    })
                };
                use wgpu::BufferUsages as U;
                ScratchBufs {
                    dims: buffer("dims", 16, U::UNIFORM | U::COPY_DST),
                    a: buffer("a", a_cap, U::STORAGE | U::COPY_DST),
                    out: buffer("out", out_cap, U::STORAGE | U::COPY_SRC),
                    readback: buffer("readback", out_cap, U::MAP_READ | U::COPY_DST),
                    a_cap,
                    out_cap,
                }
            }
        };
        self.bufs.insert(bufs)
    }
}

fn binding(binding: u32, buffer: &wgpu::Buffer, size: u64) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer,
            offset: 0,
            size: std::num::NonZeroU64::new(size),
        }),
    }
}

/// Runs one GEMM: `a_packed` is `t x k4` words (as bytes), `w` holds `n x k4` words on the device.
/// Returns the `t x n` i32 accumulators, row-major.
pub(crate) fn dispatch(
    gpu: &Gpu,
    pipeline: &Pipeline,
    scratch: &mut Scratch,
    a_packed: &[u8],
    t: usize,
    w: &GpuWeights,
) -> Result<Vec<i32>> {
    let (b, n, k4) = (&w.buffer, w.n, words(w.k));
    let out_bytes = (t * n * 4) as u64;
    let bufs = scratch.ensure(gpu, a_packed.len() as u64, out_bytes);
    let dims = [t as u32, n as u32, k4 as u32, 0u32];
    gpu.queue
        .write_buffer(&bufs.dims, 0, bytemuck::cast_slice(&dims));
    gpu.queue.write_buffer(&bufs.a, 0, a_packed);

    let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("gemm-int8"),
        layout: &pipeline.layout,
        entries: &[
            binding(0, &bufs.dims, 16),
            binding(1, &bufs.a, a_packed.len() as u64),
            binding(2, b, (n * k4 * 4) as u64),
            binding(3, &bufs.out, out_bytes),
        ],
    });
    let mut encoder = gpu
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("gemm"),
        });
    {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("gemm"),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(n.div_ceil(TILE_N) as u32, t.div_ceil(TILE_T) as u32, 1);
    }
    encoder.copy_buffer_to_buffer(&bufs.out, 0, &bufs.readback, 0, out_bytes);
    let submission = gpu.queue.submit([encoder.finish()]);

    let slice = bufs.readback.slice(0..out_bytes);
    let (tx, rx) = mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        // The receiver waits below; a send can only fail if it is gone, and then nobody cares.
        let _ = tx.send(r);
    });
    let readback_err = |reason: String| Error::ReadBack {
        adapter: gpu.adapter_name(),
        reason,
    };
    gpu.device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(submission),
            timeout: None,
        })
        .map_err(|e| readback_err(e.to_string()))?;
    gpu.take_error()?;
    rx.recv()
        .map_err(|e| readback_err(e.to_string()))?
        .map_err(|e| readback_err(e.to_string()))?;
    let out = {
        let view = slice
            .get_mapped_range()
            .map_err(|e| readback_err(e.to_string()))?;
        bytemuck::pod_collect_to_vec::<u8, i32>(&view)
    };
    bufs.readback.unmap();
    Ok(out)
}
