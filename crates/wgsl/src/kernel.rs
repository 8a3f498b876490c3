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
    /// The kernel's pipelines with `Dims` at a fixed binding (one product binds its own ranges).
    pub(crate) fn new(gpu: &Gpu, source: &str) -> Result<Pipeline> {
        Pipeline::build(gpu, source, false)
    }

    /// The kernel's pipelines with `Dims` at a dynamic offset into one uniform buffer of every
    /// dispatch's dims (a device-resident stage binds whole buffers and places operands by `Dims`).
    pub(crate) fn with_dynamic_dims(gpu: &Gpu, source: &str) -> Result<Pipeline> {
        Pipeline::build(gpu, source, true)
    }

    fn build(gpu: &Gpu, source: &str, dynamic: bool) -> Result<Pipeline> {
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
                        has_dynamic_offset: dynamic,
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
    caps: Sizes,
}

/// Bytes of each scratch buffer (dims, a, b, out) a submission needs, or has.
#[derive(Clone, Copy, Default)]
struct Sizes {
    dims: u64,
    a: u64,
    b: u64,
    out: u64,
}

impl Sizes {
    fn fits(&self, need: &Sizes) -> bool {
        self.dims >= need.dims && self.a >= need.a && self.b >= need.b && self.out >= need.out
    }

    fn max(&self, other: &Sizes) -> Sizes {
        Sizes {
            dims: self.dims.max(other.dims).max(16),
            a: self.a.max(other.a).max(16),
            b: self.b.max(other.b).max(16),
            out: self.out.max(other.out).max(16),
        }
    }
}

impl Scratch {
    fn ensure(&mut self, gpu: &Gpu, need: &Sizes) -> &ScratchBufs {
        let bufs = match self.bufs.take() {
            Some(b) if b.caps.fits(need) => b,
            old => {
                let caps = old.as_ref().map(|b| b.caps).unwrap_or_default().max(need);
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
                    dims: buffer("dims", caps.dims, U::UNIFORM | U::COPY_DST),
                    a: buffer("a", caps.a, U::STORAGE | U::COPY_DST),
                    b: buffer("b", caps.b, U::STORAGE | U::COPY_DST),
                    out: buffer("out", caps.out, U::STORAGE | U::COPY_SRC | U::COPY_DST),
                    readback: buffer("readback", caps.out, U::MAP_READ | U::COPY_DST),
                    caps,
                }
            }
        };
        self.bufs.insert(bufs)
    }
}

fn binding(
    binding: u32,
    buffer: &wgpu::Buffer,
    offset: u64,
    size: u64,
) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer,
            offset,
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

impl DeviceRhs<'_> {
    fn n(&self) -> usize {
        match self {
            DeviceRhs::Resident(w) => w.n,
            DeviceRhs::Packed { n, .. } => *n,
        }
    }

    /// Bytes written to the device for this call.
    fn upload(&self) -> u64 {
        match self {
            DeviceRhs::Resident(_) => 0,
            DeviceRhs::Packed { bytes, .. } => bytes.len() as u64,
        }
    }
}

/// One GEMM of a submission: `t` rows of A packed to [`row_bytes`]`(k)`, against `rhs`.
pub(crate) struct DeviceJob<'a> {
    pub(crate) a_packed: &'a [u8],
    pub(crate) t: usize,
    pub(crate) rhs: DeviceRhs<'a>,
    pub(crate) k: usize,
}

/// Offsets of one job's dims, A, B and accumulators inside the scratch buffers.
#[derive(Clone, Copy)]
struct Placed {
    dims: u64,
    a: u64,
    b: u64,
    out: u64,
    out_bytes: u64,
}

/// Bytes of the kernel's `Dims` uniform.
pub(crate) const DIMS_BYTES: u64 = 48;

/// Offsets in a buffer shared by several bindings: WebGPU's largest offset alignment.
const OFFSET_ALIGN: u64 = 256;

fn align(x: u64) -> u64 {
    x.next_multiple_of(OFFSET_ALIGN)
}

/// Lays the jobs out in the scratch buffers; returns each one's offsets and the sizes needed.
fn place(jobs: &[DeviceJob<'_>]) -> (Vec<Placed>, Sizes) {
    let mut at = Sizes::default();
    let placed = jobs
        .iter()
        .map(|job| {
            let out_bytes = (job.t * job.rhs.n() * 4) as u64;
            let p = Placed {
                dims: at.dims,
                a: at.a,
                b: at.b,
                out: at.out,
                out_bytes,
            };
            at.dims += OFFSET_ALIGN;
            at.a = align(at.a + job.a_packed.len() as u64);
            at.b = align(at.b + job.rhs.upload());
            at.out = align(at.out + out_bytes);
            p
        })
        .collect();
    (placed, at)
}

/// Writes the jobs' operands into the queue and makes their bind groups.
fn prepare(
    gpu: &Gpu,
    pipeline: &Pipeline,
    bufs: &ScratchBufs,
    jobs: &[DeviceJob<'_>],
    placed: &[Placed],
    tuning: Tuning,
) -> Vec<wgpu::BindGroup> {
    jobs.iter()
        .zip(placed)
        .map(|(job, p)| {
            let stride = row_bytes(job.k);
            let n = job.rhs.n();
            let stages = Grid::new(job.t, n, job.k, tuning).stages;
            let dims = [
                job.t as u32,
                n as u32,
                (stride / 16) as u32,
                stages,
                0,
                0,
                0,
                1,
                0,
                0,
                0,
                0,
            ];
            gpu.queue
                .write_buffer(&bufs.dims, p.dims, bytemuck::cast_slice(&dims));
            gpu.queue.write_buffer(&bufs.a, p.a, job.a_packed);
            let (b, b_offset, b_bytes) = match &job.rhs {
                DeviceRhs::Resident(w) => (&w.buffer, 0, (w.n * stride) as u64),
                DeviceRhs::Packed { bytes, .. } => {
                    gpu.queue.write_buffer(&bufs.b, p.b, bytes);
                    (&bufs.b, p.b, bytes.len() as u64)
                }
            };
            gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("gemm-int8"),
                layout: &pipeline.layout,
                entries: &[
                    binding(0, &bufs.dims, p.dims, DIMS_BYTES),
                    binding(1, &bufs.a, p.a, job.a_packed.len() as u64),
                    binding(2, b, b_offset, b_bytes),
                    binding(3, &bufs.out, p.out, p.out_bytes),
                ],
            })
        })
        .collect()
}

/// Workgroup counts of a dispatch of `groups` workgroups in one line, folded into a second
/// dimension past the per-dimension limit (`gemv` recovers the line index from both).
fn fold(groups: usize) -> (u32, u32) {
    let x = groups.clamp(1, MAX_GROUPS);
    (x as u32, groups.div_ceil(x) as u32)
}

/// How a backend picks and shapes its dispatches; whichever it picks, the integers are the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Rows of A up to which `gemv` runs instead of `tiled` (at most [`GEMV_MAX_T`]).
    pub gemv_rows: usize,
    /// `tiled` workgroups below which K is split into slices.
    pub split_below: usize,
    /// The fewest K stages (64 int8 each) a split-K slice takes.
    pub min_slice: usize,
}

impl Default for Tuning {
    /// `gemv` up to 16 rows; K split below 512 workgroups (about four per multiprocessor of a large
    /// GPU; a small one just runs the slices one after another), slices of at least 2 stages: on
    /// the H200 the best of the pairs `gpu_kernel_split_*` tries for the products with few tiles
    /// (docs/gpu.md).
    fn default() -> Self {
        Tuning {
            gemv_rows: GEMV_MAX_T,
            split_below: 512,
            min_slice: 2,
        }
    }
}

/// How `tiled` walks K for a `t x n x k` product: (slices, K stages per slice). One slice while
/// the output's tiles alone fill the GPU.
fn split_k(t: usize, n: usize, k: usize, tuning: Tuning) -> (usize, usize) {
    let stages = row_bytes(k) / ROW_ALIGN;
    let groups = n.div_ceil(TILE) * t.div_ceil(TILE);
    let want = tuning.split_below.div_ceil(groups.max(1));
    let slices = want.min(stages / tuning.min_slice.max(1)).max(1);
    let per = stages.div_ceil(slices);
    (stages.div_ceil(per), per)
}

/// Whether `gemv` runs a product of `t` rows.
fn uses_gemv(t: usize, tuning: Tuning) -> bool {
    t <= tuning.gemv_rows.min(GEMV_MAX_T)
}

/// How one product is dispatched: the entry point, the workgroup grid and K stages per slice.
pub(crate) struct Grid {
    pub(crate) gemv: bool,
    pub(crate) groups: (u32, u32, u32),
    pub(crate) stages: u32,
    /// K slices a product (their sums added into the output).
    slices: u32,
}

impl Grid {
    pub(crate) fn new(t: usize, n: usize, k: usize, tuning: Tuning) -> Grid {
        Grid::batched(t, n, k, tuning, 1)
    }

    /// `batches` products of one shape in one dispatch (z: the batch, then its K slice).
    pub(crate) fn batched(t: usize, n: usize, k: usize, tuning: Tuning, batches: usize) -> Grid {
        let batches = batches.max(1) as u32;
        if uses_gemv(t, tuning) {
            let (x, y) = fold(n.div_ceil(GEMV_COLS));
            return Grid {
                gemv: true,
                groups: (x, y, batches),
                stages: 1,
                slices: 1,
            };
        }
        let (slices, stages) = split_k(t, n, k, tuning);
        Grid {
            gemv: false,
            groups: (
                n.div_ceil(TILE) as u32,
                t.div_ceil(TILE) as u32,
                slices as u32 * batches,
            ),
            stages: stages as u32,
            slices: slices as u32,
        }
    }

    /// Whether its slices add into the output, which must then start at zero.
    pub(crate) fn adds(&self) -> bool {
        self.slices > 1
    }

    pub(crate) fn entry<'p>(&self, pipeline: &'p Pipeline) -> &'p wgpu::ComputePipeline {
        match self.gemv {
            true => &pipeline.gemv,
            false => &pipeline.tiled,
        }
    }

    pub(crate) fn layout(pipeline: &Pipeline) -> &wgpu::BindGroupLayout {
        &pipeline.layout
    }
}

/// Records `reps` dispatches of one GEMM (`gemv` up to `tuning.gemv_rows` rows of A) into a pass.
#[allow(clippy::too_many_arguments)]
fn record(
    pass: &mut wgpu::ComputePass<'_>,
    pipeline: &Pipeline,
    bind_group: &wgpu::BindGroup,
    t: usize,
    n: usize,
    k: usize,
    tuning: Tuning,
    reps: usize,
) {
    pass.set_bind_group(0, bind_group, &[]);
    let grid = Grid::new(t, n, k, tuning);
    pass.set_pipeline(grid.entry(pipeline));
    let (x, y, z) = grid.groups;
    for _ in 0..reps {
        pass.dispatch_workgroups(x, y, z);
    }
}

/// Whether a job's `tiled` slices add into its output, which must then start at zero.
fn adds(job: &DeviceJob<'_>, tuning: Tuning) -> bool {
    Grid::new(job.t, job.rhs.n(), job.k, tuning).adds()
}

/// How long a dispatch's wait polls the device before it sleeps on the fence: a decode-sized
/// product is done in tens of microseconds, and a thread woken from the fence's wait costs about
/// as much again (the stage's thread has nothing else to do meanwhile).
const SPIN: std::time::Duration = std::time::Duration::from_millis(2);

/// Waits until the read-back buffer's mapping (requested after `submission`) is resolved: polls
/// the device for up to [`SPIN`], then blocks on the submission's fence.
fn wait_mapped(
    gpu: &Gpu,
    submission: wgpu::SubmissionIndex,
    rx: &mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
) -> std::result::Result<std::result::Result<(), wgpu::BufferAsyncError>, String> {
    let start = Instant::now();
    while start.elapsed() < SPIN {
        gpu.device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| e.to_string())?;
        if let Ok(mapped) = rx.try_recv() {
            return Ok(mapped);
        }
        std::hint::spin_loop();
    }
    gpu.device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(submission),
            timeout: None,
        })
        .map_err(|e| e.to_string())?;
    rx.recv().map_err(|e| e.to_string())
}

/// Maps `slice` of a read-back buffer (written by `submission`) and waits for it: the view, or
/// the device's error.
pub(crate) fn map_read(
    gpu: &Gpu,
    slice: wgpu::BufferSlice<'_>,
    submission: wgpu::SubmissionIndex,
) -> Result<wgpu::BufferView> {
    let (tx, rx) = mpsc::channel();
    slice.map_async(wgpu::MapMode::Read, move |r| {
        // The receiver waits below; a send can only fail if it is gone, and then nobody cares.
        let _ = tx.send(r);
    });
    let readback_err = |reason: String| Error::ReadBack {
        adapter: gpu.adapter_name(),
        reason,
    };
    let mapped = wait_mapped(gpu, submission, &rx).map_err(readback_err)?;
    gpu.take_error()?;
    mapped.map_err(|e| readback_err(e.to_string()))?;
    slice
        .get_mapped_range()
        .map_err(|e| readback_err(e.to_string()))
}

/// Accumulators above this many bytes are copied out of the mapped read-back buffer by several
/// threads: one thread's reads of host memory the device wrote run at a few GB/s.
const PARALLEL_COPY_BYTES: usize = 4 << 20;

/// Copies little-endian i32 accumulators out of a mapped range.
fn copy_out(bytes: &[u8], out: &mut [i32]) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    if bytes.len() < PARALLEL_COPY_BYTES || threads < 2 {
        return copy_part(bytes, out);
    }
    let per = out.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (src, dst) in bytes.chunks(per * 4).zip(out.chunks_mut(per)) {
            scope.spawn(move || copy_part(src, dst));
        }
    });
}

fn copy_part(bytes: &[u8], out: &mut [i32]) {
    match bytemuck::try_cast_slice::<u8, i32>(bytes) {
        Ok(acc) => out.copy_from_slice(acc),
        Err(_) => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
}

/// Runs the jobs in one submission with one read-back: job i's `t x n` i32 accumulators,
/// row-major, go into `outs[i]`; `tuning` picks each job's entry point and K slices.
/// Every job must have rows and columns; a job's operands must each fit one binding (the caller
/// splits larger ones).
pub(crate) fn dispatch(
    gpu: &Gpu,
    pipeline: &Pipeline,
    scratch: &mut Scratch,
    profile: &Profile,
    jobs: &[DeviceJob<'_>],
    tuning: Tuning,
    outs: &mut [&mut [i32]],
) -> Result<()> {
    let start = Instant::now();
    let (placed, need) = place(jobs);
    let bufs = scratch.ensure(gpu, &need);
    let groups = prepare(gpu, pipeline, bufs, jobs, &placed, tuning);
    let prepared = Instant::now();
    let mut encoder = gpu
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("gemm"),
        });
    for (job, p) in jobs.iter().zip(&placed) {
        if adds(job, tuning) {
            encoder.clear_buffer(&bufs.out, p.out, Some(p.out_bytes));
        }
    }
    {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("gemm"),
            timestamp_writes: None,
        });
        for (job, group) in jobs.iter().zip(&groups) {
            record(
                &mut pass,
                pipeline,
                group,
                job.t,
                job.rhs.n(),
                job.k,
                tuning,
                1,
            );
        }
    }
    let total_out = need.out;
    encoder.copy_buffer_to_buffer(&bufs.out, 0, &bufs.readback, 0, total_out);
    let submission = gpu.queue.submit([encoder.finish()]);
    let submitted = Instant::now();

    let slice = bufs.readback.slice(0..total_out);
    let done = {
        let view = map_read(gpu, slice, submission)?;
        let done = Instant::now();
        for (p, out) in placed.iter().zip(outs.iter_mut()) {
            copy_out(&view[p.out as usize..(p.out + p.out_bytes) as usize], out);
        }
        done
    };
    bufs.readback.unmap();
    let up: u64 = jobs
        .iter()
        .map(|j| j.a_packed.len() as u64 + j.rhs.upload())
        .sum();
    let gemv = jobs.iter().filter(|j| uses_gemv(j.t, tuning)).count();
    profile.add(
        jobs.len(),
        gemv,
        up,
        placed.iter().map(|p| p.out_bytes).sum(),
        [
            prepared - start,
            submitted - start,
            done - submitted,
            done.elapsed(),
        ],
    );
    Ok(())
}

/// Prepares `job` alone in the scratch buffers and returns a function that submits one pass of
/// `reps` dispatches of it. The output is left as the dispatches leave it (split-K slices add
/// into it unzeroed): for timing the kernel and keeping the card busy, not for the product.
fn repeated<'g>(
    gpu: &'g Gpu,
    pipeline: &'g Pipeline,
    scratch: &mut Scratch,
    job: &DeviceJob<'_>,
    tuning: Tuning,
) -> impl Fn(usize) -> wgpu::SubmissionIndex + 'g {
    let jobs = std::slice::from_ref(job);
    let (placed, need) = place(jobs);
    let bufs = scratch.ensure(gpu, &need);
    let group = prepare(gpu, pipeline, bufs, jobs, &placed, tuning).remove(0);
    let (t, n, k) = (job.t, job.rhs.n(), job.k);
    move |reps| {
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("gemm-repeated"),
            });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("gemm-repeated"),
                timestamp_writes: None,
            });
            record(&mut pass, pipeline, &group, t, n, k, tuning, reps);
        }
        gpu.queue.submit([encoder.finish()])
    }
}

/// Seconds of one kernel run alone: `reps` dispatches of the same GEMM recorded in one pass,
/// submitted once and waited for, divided by `reps` (no upload or read-back inside the timing).
pub(crate) fn kernel_seconds(
    gpu: &Gpu,
    pipeline: &Pipeline,
    scratch: &mut Scratch,
    job: &DeviceJob<'_>,
    tuning: Tuning,
    reps: usize,
) -> Result<f64> {
    let run = repeated(gpu, pipeline, scratch, job, tuning);
    wait_for(gpu, run(1))?; // the operands' writes and a warm-up
    let start = Instant::now();
    wait_for(gpu, run(reps.max(1)))?;
    let secs = start.elapsed().as_secs_f64();
    gpu.take_error()?;
    Ok(secs / reps.max(1) as f64)
}

/// Blocks until `submission` has run.
fn wait_for(gpu: &Gpu, submission: wgpu::SubmissionIndex) -> Result<()> {
    gpu.device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(submission),
            timeout: None,
        })
        .map(|_| ())
        .map_err(|e| Error::ReadBack {
            adapter: gpu.adapter_name(),
            reason: e.to_string(),
        })
}

/// Dispatches of the product a submission of [`keep_busy`] holds.
const BUSY_REPS: usize = 8;

/// Runs `job` over and over for at least `budget` with no gap on the GPU (the next submission is
/// queued before the previous one is waited for); returns the time taken and the submissions.
pub(crate) fn keep_busy(
    gpu: &Gpu,
    pipeline: &Pipeline,
    scratch: &mut Scratch,
    job: &DeviceJob<'_>,
    tuning: Tuning,
    budget: std::time::Duration,
) -> Result<(std::time::Duration, usize)> {
    let start = Instant::now();
    let run = repeated(gpu, pipeline, scratch, job, tuning);
    let mut submissions = 1;
    let mut previous = run(BUSY_REPS);
    while start.elapsed() < budget {
        let next = run(BUSY_REPS);
        submissions += 1;
        wait_for(gpu, previous)?;
        previous = next;
    }
    wait_for(gpu, previous)?;
    gpu.take_error()?;
    Ok((start.elapsed(), submissions))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_k_covers_every_stage_once_and_only_splits_few_tiles() {
        let tuning = Tuning::default();
        for t in [17, 128, 512, 597, 4096] {
            for n in [2, 192, 1536, 2048, 17920, 49152] {
                for k in [1, 64, 65, 576, 1536, 8960, 131_071] {
                    let (slices, per) = split_k(t, n, k, tuning);
                    let stages = row_bytes(k) / ROW_ALIGN;
                    // The slices tile the stages: none empty, none past the end.
                    assert!(slices >= 1 && per >= 1, "{t} {n} {k}");
                    assert!(slices * per >= stages && (slices - 1) * per < stages);
                    let groups = n.div_ceil(TILE) * t.div_ceil(TILE);
                    if groups >= tuning.split_below {
                        assert_eq!(slices, 1, "{t} {n} {k}: enough tiles, no split");
                    }
                    if slices > 1 {
                        assert!(per >= tuning.min_slice, "{t} {n} {k}: slices of {per}");
                    }
                }
            }
        }
        // The products that split at T = 512 on the 1.39 B model, and one that does not.
        assert_eq!(split_k(512, 1536, 1536, tuning), (8, 3));
        assert_eq!(split_k(512, 1536, 8960, tuning), (11, 13));
        assert_eq!(split_k(512, 17920, 1536, tuning).0, 1);
        let never = Tuning {
            split_below: 0,
            ..tuning
        };
        assert_eq!(split_k(512, 1536, 8960, never).0, 1);
    }
}
