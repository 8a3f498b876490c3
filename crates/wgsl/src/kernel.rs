//! The WGSL GEMM kernel: its sources (`gemm.wgsl` plus one `dot4` variant), the two compute
//! pipelines (`tiled`, and `gemv` for T <= 16), and one dispatch with read-back of the i32
//! accumulators straight into the caller's buffer.

use std::sync::mpsc;
use std::time::Instant;

use crate::backend::GpuWeights;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::profile::Profile;

/// The kernel body: tiled i32 GEMM over int8 packed four to a u32; needs a `dot4` function.
pub const GEMM_WGSL: &str = include_str!("gemm.wgsl");
/// `dot4` through `dot4I8Packed` (WGSL's `packed_4x8_integer_dot_product` extension).
pub const DOT4_PACKED_WGSL: &str = include_str!("dot4_packed.wgsl");
/// `dot4` by shifting each byte to the top of an i32 and sign-extending it back.
pub const DOT4_SHIFT_WGSL: &str = include_str!("dot4_shift.wgsl");

/// Output rows and columns per `tiled` workgroup; must match `TILE` in `gemm.wgsl`.
const TILE: usize = 128;
/// Rows of A up to which the `gemv` entry point can run; must match `GEMV_MAX_T` in `gemm.wgsl`.
pub const GEMV_MAX_T: usize = 16;
/// Output columns per `gemv` workgroup (256 threads, 32 a column).
const GEMV_COLS: usize = 8;
/// Bytes a packed row is padded to: the K stage of `tiled` (`KV` vec4 words of 16 int8).
const ROW_ALIGN: usize = 64;
/// The most workgroups of one dispatch dimension (WebGPU's default limit).
const MAX_GROUPS: usize = 65535;

/// Which WGSL program computes the 4 x int8 dot products.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kernel {
    /// `dot4I8Packed` where the instance implements it, shift-and-sign-extend otherwise.
    Auto,
    /// `dot4I8Packed` (fails to build where the extension is missing).
    Packed,
    /// Shift-and-sign-extend, on every adapter.
    ShiftExtend,
    /// A complete WGSL program with the same bindings, entry points and tiling (tests build mutants
    /// this way).
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

/// The compiled pipelines (one module, two entry points) and their bind group layout.
pub(crate) struct Pipeline {
    tiled: wgpu::ComputePipeline,
    gemv: wgpu::ComputePipeline,
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
        let entry = |name: &'static str| {
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(name),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            })
        };
        let tiled = entry("tiled");
        let gemv = entry("gemv");
        gpu.take_error()?;
        Ok(Pipeline {
            tiled,
            gemv,
            layout,
        })
    }
}

/// Bytes of one packed row of `k` int8 values: `k` rounded up to [`ROW_ALIGN`].
pub(crate) fn row_bytes(k: usize) -> usize {
    k.div_ceil(ROW_ALIGN).max(1) * ROW_ALIGN
}

/// Packs a row-major `rows x k` int8 matrix into rows of [`row_bytes`], zero-padded.
pub(crate) fn pack_rows(m: &[i8], rows: usize, k: usize) -> Vec<u8> {
    let stride = row_bytes(k);
    let mut packed = vec![0u8; rows * stride];
    if k > 0 {
        for (dst, src) in packed.chunks_exact_mut(stride).zip(m.chunks_exact(k)) {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = s as u8;
            }
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
    b: wgpu::Buffer,
    out: wgpu::Buffer,
    readback: wgpu::Buffer,
    a_cap: u64,
    b_cap: u64,
    out_cap: u64,
}

impl Scratch {
    fn ensure(&mut self, gpu: &Gpu, a_bytes: u64, b_bytes: u64, out_bytes: u64) -> &ScratchBufs {
        let bufs = match self.bufs.take() {
            Some(b) if b.a_cap >= a_bytes && b.b_cap >= b_bytes && b.out_cap >= out_bytes => b,
            old => {
                let grow = |need: u64, had: Option<u64>| need.max(had.unwrap_or(0)).max(16);
                let a_cap = grow(a_bytes, old.as_ref().map(|b| b.a_cap));
                let b_cap = grow(b_bytes, old.as_ref().map(|b| b.b_cap));
                let out_cap = grow(out_bytes, old.as_ref().map(|b| b.out_cap));
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
                    b: buffer("b", b_cap, U::STORAGE | U::COPY_DST),
                    out: buffer("out", out_cap, U::STORAGE | U::COPY_SRC),
                    readback: buffer("readback", out_cap, U::MAP_READ | U::COPY_DST),
                    a_cap,
                    b_cap,
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

/// The B operand of one dispatch: weights resident on the device, or packed rows for this call.
pub(crate) enum DeviceRhs<'a> {
    Resident(&'a GpuWeights),
    /// `n` rows of [`row_bytes`] each (attention's K rows and Vᵀ rows).
    Packed {
        bytes: &'a [u8],
        n: usize,
    },
}

/// Workgroup counts of a dispatch of `groups` workgroups in one line, folded into a second
/// dimension past the per-dimension limit (`gemv` recovers the line index from both).
fn fold(groups: usize) -> (u32, u32) {
    let x = groups.clamp(1, MAX_GROUPS);
    (x as u32, groups.div_ceil(x) as u32)
}

/// The buffers and bind group of one dispatch, its operands written into the queue.
struct Prepared {
    bind_group: wgpu::BindGroup,
    out_bytes: u64,
    b_upload: u64,
}

#[allow(clippy::too_many_arguments)]
fn prepare(
    gpu: &Gpu,
    pipeline: &Pipeline,
    scratch: &mut Scratch,
    a_packed: &[u8],
    t: usize,
    rhs: &DeviceRhs<'_>,
    k: usize,
) -> Prepared {
    let stride = row_bytes(k);
    let (n, b_upload) = match rhs {
        DeviceRhs::Resident(w) => (w.n, 0),
        DeviceRhs::Packed { bytes, n } => (*n, bytes.len() as u64),
    };
    let out_bytes = (t * n * 4) as u64;
    let bufs = scratch.ensure(gpu, a_packed.len() as u64, b_upload, out_bytes);
    let dims = [t as u32, n as u32, (stride / 16) as u32, 0u32];
    gpu.queue
        .write_buffer(&bufs.dims, 0, bytemuck::cast_slice(&dims));
    gpu.queue.write_buffer(&bufs.a, 0, a_packed);
    let (b, b_bytes) = match rhs {
        DeviceRhs::Resident(w) => (&w.buffer, (w.n * stride) as u64),
        DeviceRhs::Packed { bytes, .. } => {
            gpu.queue.write_buffer(&bufs.b, 0, bytes);
            (&bufs.b, bytes.len() as u64)
        }
    };
    let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("gemm-int8"),
        layout: &pipeline.layout,
        entries: &[
            binding(0, &bufs.dims, 16),
            binding(1, &bufs.a, a_packed.len() as u64),
            binding(2, b, b_bytes),
            binding(3, &bufs.out, out_bytes),
        ],
    });
    Prepared {
        bind_group,
        out_bytes,
        b_upload,
    }
}

/// Records `reps` dispatches of one GEMM (`gemv` up to `gemv_rows` rows of A) into a pass.
fn record(
    pass: &mut wgpu::ComputePass<'_>,
    pipeline: &Pipeline,
    bind_group: &wgpu::BindGroup,
    t: usize,
    n: usize,
    gemv_rows: usize,
    reps: usize,
) {
    pass.set_bind_group(0, bind_group, &[]);
    let (entry, (x, y)) = if t <= gemv_rows.min(GEMV_MAX_T) {
        (&pipeline.gemv, fold(n.div_ceil(GEMV_COLS)))
    } else {
        (
            &pipeline.tiled,
            (n.div_ceil(TILE) as u32, t.div_ceil(TILE) as u32),
        )
    };
    pass.set_pipeline(entry);
    for _ in 0..reps {
        pass.dispatch_workgroups(x, y, 1);
    }
}

/// Runs one GEMM: `a_packed` is `t` rows of [`row_bytes`]`(k)`, `rhs` holds `n` rows of the same;
/// `gemv` runs it when `t <= gemv_rows` (at most [`GEMV_MAX_T`]). Writes the `t x n` i32
/// accumulators, row-major, into `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dispatch(
    gpu: &Gpu,
    pipeline: &Pipeline,
    scratch: &mut Scratch,
    profile: &Profile,
    a_packed: &[u8],
    t: usize,
    rhs: &DeviceRhs<'_>,
    k: usize,
    gemv_rows: usize,
    out: &mut [i32],
) -> Result<()> {
    let start = Instant::now();
    let n = out.len() / t.max(1);
    let prepared = prepare(gpu, pipeline, scratch, a_packed, t, rhs, k);
    let out_bytes = prepared.out_bytes;
    let bufs = scratch.bufs.as_ref().expect("prepare made the buffers");
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
        record(
            &mut pass,
            pipeline,
            &prepared.bind_group,
            t,
            n,
            gemv_rows,
            1,
        );
    }
    encoder.copy_buffer_to_buffer(&bufs.out, 0, &bufs.readback, 0, out_bytes);
    let submission = gpu.queue.submit([encoder.finish()]);
    let submitted = Instant::now();

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
    let done = Instant::now();
    {
        let view = slice
            .get_mapped_range()
            .map_err(|e| readback_err(e.to_string()))?;
        match bytemuck::try_cast_slice::<u8, i32>(&view) {
            Ok(acc) => out.copy_from_slice(acc),
            Err(_) => {
                for (o, c) in out.iter_mut().zip(view.chunks_exact(4)) {
                    *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
    }
    bufs.readback.unmap();
    profile.add(
        t <= gemv_rows.min(GEMV_MAX_T),
        (a_packed.len() as u64) + prepared.b_upload,
        out_bytes,
        [submitted - start, done - submitted, done.elapsed()],
    );
    Ok(())
}

/// Seconds of one kernel run alone: `reps` dispatches of the same GEMM recorded in one pass,
/// submitted once and waited for, divided by `reps` (no upload or read-back inside the timing).
#[allow(clippy::too_many_arguments)]
pub(crate) fn kernel_seconds(
    gpu: &Gpu,
    pipeline: &Pipeline,
    scratch: &mut Scratch,
    a_packed: &[u8],
    t: usize,
    rhs: &DeviceRhs<'_>,
    k: usize,
    gemv_rows: usize,
    reps: usize,
) -> Result<f64> {
    let n = match rhs {
        DeviceRhs::Resident(w) => w.n,
        DeviceRhs::Packed { n, .. } => *n,
    };
    let prepared = prepare(gpu, pipeline, scratch, a_packed, t, rhs, k);
    let wait = |submission| {
        gpu.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(submission),
                timeout: None,
            })
            .map_err(|e| Error::ReadBack {
                adapter: gpu.adapter_name(),
                reason: e.to_string(),
            })
    };
    let run = |reps: usize| {
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("gemm-timing"),
            });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("gemm-timing"),
                timestamp_writes: None,
            });
            record(
                &mut pass,
                pipeline,
                &prepared.bind_group,
                t,
                n,
                gemv_rows,
                reps,
            );
        }
        gpu.queue.submit([encoder.finish()])
    };
    wait(run(1))?; // the operands' writes and a warm-up
    let start = Instant::now();
    wait(run(reps.max(1)))?;
    let secs = start.elapsed().as_secs_f64();
    gpu.take_error()?;
    Ok(secs / reps.max(1) as f64)
}
