//! `GpuBackend`: an adapter that passed the exactness gates, weight upload (`GpuWeights`), and the
//! i32-accumulator GEMM on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use daisy_gemm_int8::{Backend, BatchItem, CpuBackend, PackedWeights, Quantized, Rhs};

use crate::device::Gpu;
use crate::error::{Error, FloatMismatch, Result};
use crate::gates;
use crate::kernel::{self, DeviceJob, DeviceRhs, GEMV_MAX_T, Kernel, Pipeline, Scratch, Tuning};
use crate::profile::{GpuProfile, Profile};

/// The largest K whose i32 accumulation is exact: 127² · 131071 < 2³¹ (DESIGN §3.1).
pub const MAX_K: usize = daisy_gemm_int8::MAX_K;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The verified INT8 GEMM on one wgpu device. Only constructed after the gates pass.
pub struct GpuBackend {
    gpu: Gpu,
    pipeline: Pipeline,
    /// The kernel's WGSL (a device-resident stage builds its own pipelines from it).
    source: String,
    kernel_name: &'static str,
    id: u64,
    scratch: Mutex<Scratch>,
    /// Device copies of [`PackedWeights`], keyed by [`PackedWeights::id`].
    cache: Mutex<HashMap<u64, Arc<GpuWeights>>>,
    profile: Profile,
    /// The CPU kernels, for products of fewer than `cpu_below` multiply-adds.
    cpu: CpuBackend,
    cpu_below: usize,
    /// How dispatches are picked and shaped.
    tuning: Tuning,
    /// The float library's gate on this device, run once, before the first stage's layers go
    /// onto it ([`GpuBackend::float_gate`]).
    float_gate: OnceLock<std::result::Result<(), FloatMismatch>>,
}

/// Products of fewer multiply-adds than this run on the CPU kernels when the backend is used as a
/// [`Backend`]: below it, one GPU round trip (submission, wait, read-back) costs more than the
/// product (decode's attention of one query row). The integers are the same on either side.
pub const CPU_BELOW_MACS: usize = 1 << 21;

impl std::fmt::Debug for GpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBackend")
            .field("adapter", &self.adapter_name())
            .field("kernel", &self.kernel_name)
            .finish()
    }
}

/// Int8 weights (N x K, row n = output channel n) resident on one backend's device.
/// Dropping the handle frees the device memory.
pub struct GpuWeights {
    /// `n` rows of [`kernel::row_bytes`]`(k)` bytes.
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) n: usize,
    pub(crate) k: usize,
    backend: u64,
    id: u64,
}

impl std::fmt::Debug for GpuWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuWeights")
            .field("n", &self.n)
            .field("k", &self.k)
            .field("id", &self.id)
            .finish()
    }
}

impl GpuWeights {
    /// Output channels (rows).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Inner dimension (columns).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes held on the device.
    pub fn device_bytes(&self) -> u64 {
        self.buffer.size()
    }
}

fn check_len(operand: &'static str, got: usize, rows: usize, k: usize) -> Result<()> {
    let expected = rows * k;
    if got != expected {
        return Err(Error::ShapeMismatch {
            operand,
            got,
            expected,
        });
    }
    Ok(())
}

fn check_k(k: usize) -> Result<()> {
    if k > MAX_K {
        return Err(Error::KTooLarge { k, max: MAX_K });
    }
    Ok(())
}

/// How long [`warm_up`] keeps a card busy by default (`DAISY_GPU_WARM_UP_MS` sets it; 0: not at all).
pub const WARM_UP: Duration = Duration::from_millis(300);

/// [`GpuBackend::warm_up`] for the `backend` a stage runs on, if it is a GPU: for
/// `DAISY_GPU_WARM_UP_MS` milliseconds ([`WARM_UP`] by default). Returns the time it took (zero for
/// any other backend).
pub fn warm_up(backend: &dyn Backend) -> Result<Duration> {
    let Some(gpu) = backend
        .as_any()
        .and_then(|a| a.downcast_ref::<GpuBackend>())
    else {
        return Ok(Duration::ZERO);
    };
    let budget = match std::env::var("DAISY_GPU_WARM_UP_MS") {
        Ok(ms) => Duration::from_millis(ms.trim().parse().map_err(|_| Error::Setting {
            name: "DAISY_GPU_WARM_UP_MS",
            got: ms.clone(),
            expected: "a whole number of milliseconds",
        })?),
        Err(_) => WARM_UP,
    };
    if budget.is_zero() {
        return Ok(Duration::ZERO);
    }
    gpu.warm_up(budget)
}

impl GpuBackend {
    /// Opens the adapter the environment names, builds the best kernel it supports
    /// (`dot4I8Packed` where implemented) and runs the exactness gates.
    pub fn new() -> Result<GpuBackend> {
        GpuBackend::with_kernel(Kernel::Auto)
    }

    /// Like [`GpuBackend::new`] with a chosen kernel; fails if the kernel fails a gate.
    pub fn with_kernel(kernel: Kernel) -> Result<GpuBackend> {
        let mut backend = GpuBackend::ungated(kernel)?;
        gates::run(&backend)?;
        // The shared gates go through `Backend`: every product of theirs on the GPU.
        let cpu_below = std::mem::replace(&mut backend.cpu_below, 0);
        daisy_gemm_int8::exact_gates(&backend)?;
        backend.cpu_below = cpu_below;
        backend.clear_cache();
        backend.reset_profile();
        Ok(backend)
    }

    /// Builds the backend without running the gates: for tests that inject a kernel after them.
    #[doc(hidden)]
    pub fn ungated(kernel: Kernel) -> Result<GpuBackend> {
        let gpu = Gpu::open()?;
        let source = kernel.source(gpu.packed_dot);
        let pipeline = Pipeline::new(&gpu, &source)?;
        Ok(GpuBackend {
            kernel_name: kernel.name(gpu.packed_dot),
            gpu,
            pipeline,
            source,
            id: next_id(),
            scratch: Mutex::new(Scratch::default()),
            cache: Mutex::new(HashMap::new()),
            profile: Profile::default(),
            cpu: CpuBackend::new(),
            cpu_below: std::env::var("DAISY_GPU_CPU_BELOW")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(CPU_BELOW_MACS),
            tuning: Tuning::default(),
            float_gate: OnceLock::new(),
        })
    }

    pub(crate) fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The float library's gate on this device (`floats::gate`), run on the first call; its
    /// verdict is kept, any other error (the device's own) is returned and the next call tries
    /// again.
    pub(crate) fn float_gate(&self) -> Result<()> {
        if let Some(verdict) = self.float_gate.get() {
            return verdict.clone().map_err(Error::FloatGate);
        }
        let verdict = match crate::floats::gate(&self.gpu) {
            Ok(()) => Ok(()),
            Err(Error::FloatGate(m)) => Err(m),
            Err(e) => return Err(e),
        };
        self.float_gate
            .get_or_init(|| verdict)
            .clone()
            .map_err(Error::FloatGate)
    }

    pub(crate) fn profile_add(
        &self,
        jobs: usize,
        gemv: usize,
        bytes: (u64, u64),
        times: [std::time::Duration; 4],
    ) {
        self.profile.add(jobs, gemv, bytes.0, bytes.1, times);
    }

    pub(crate) fn profile_kernels(&self, timed: impl IntoIterator<Item = (String, u64)>) {
        self.profile.add_kernels(timed);
    }

    pub(crate) fn kernel_source(&self) -> &str {
        &self.source
    }

    /// Sets the rows of A up to which the `gemv` entry point runs instead of `tiled` (clamped to
    /// [`GEMV_MAX_T`]; 0: `tiled` always). Either gives the same integers; this is for benchmarks.
    pub fn set_gemv_rows(&mut self, rows: usize) {
        self.tuning.gemv_rows = rows.min(GEMV_MAX_T);
    }

    /// Sets how dispatches are picked and shaped (`gemv`'s rows are clamped to [`GEMV_MAX_T`]).
    /// Any tuning gives the same integers; this is for benchmarks.
    pub fn set_tuning(&mut self, tuning: Tuning) {
        self.tuning = Tuning {
            gemv_rows: tuning.gemv_rows.min(GEMV_MAX_T),
            ..tuning
        };
    }

    /// How dispatches are picked and shaped.
    pub fn tuning(&self) -> Tuning {
        self.tuning
    }

    /// Seconds of the kernel alone for `a` (T x K) against resident weights, averaged over `reps`
    /// dispatches recorded in one submission (no upload or read-back in the time): the kernel's
    /// own throughput, for benchmarks.
    pub fn kernel_seconds(&self, a: &[i8], t: usize, w: &GpuWeights, reps: usize) -> Result<f64> {
        if w.backend != self.id {
            return Err(Error::ForeignWeights { id: w.id });
        }
        check_len("a", a.len(), t, w.k)?;
        check_k(w.k)?;
        let packed = kernel::pack_rows(a, t, w.k);
        let job = DeviceJob {
            a_packed: &packed,
            t,
            rhs: DeviceRhs::Resident(w),
            k: w.k,
        };
        let mut scratch = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        kernel::kernel_seconds(
            &self.gpu,
            &self.pipeline,
            &mut scratch,
            &job,
            self.tuning,
            reps,
        )
    }

    /// Raises the card's clock before the first pass: keeps it busy with the GEMM kernel (a
    /// 512 x 1024 x 16384 product, 512 workgroups) for about `budget`. An idle card sits at its
    /// lowest clock and raises it only after a while of sustained load: on the H100 about 150 ms
    /// at 345 MHz before 1980, so a 600-token prefill that found the card idle ran at a quarter to
    /// a sixth of the rate. Nothing on a software adapter (no clock to raise). Returns the time
    /// it took.
    pub fn warm_up(&self, budget: Duration) -> Result<Duration> {
        if self.gpu.info.device_type == wgpu::DeviceType::Cpu {
            return Ok(Duration::ZERO);
        }
        self.keep_busy(512, 1024, 16384, budget)
            .map(|(took, _)| took)
    }

    /// [`GpuBackend::warm_up`]'s work on any adapter with a `t x k x n` product of ones (the
    /// kernel's time does not depend on the values) in buffers of its own, freed on return:
    /// (time taken, submissions).
    pub fn keep_busy(
        &self,
        t: usize,
        k: usize,
        n: usize,
        budget: Duration,
    ) -> Result<(Duration, usize)> {
        check_k(k)?;
        let a = kernel::pack_rows(&vec![1; t * k], t, k);
        let b = kernel::pack_rows(&vec![1; n * k], n, k);
        let job = DeviceJob {
            a_packed: &a,
            t,
            rhs: DeviceRhs::Packed { bytes: &b, n },
            k,
        };
        let mut scratch = Scratch::default();
        kernel::keep_busy(
            &self.gpu,
            &self.pipeline,
            &mut scratch,
            &job,
            self.tuning,
            budget,
        )
    }

    /// Sets the size (multiply-adds) below which products run on the CPU kernels; 0 sends every
    /// product to the GPU. Only [`Backend::gemm_i32`] looks at it; the gates always run on the GPU.
    pub fn set_cpu_below(&mut self, macs: usize) {
        self.cpu_below = macs;
    }

    /// The size below which products run on the CPU kernels (see [`GpuBackend::set_cpu_below`]).
    pub fn cpu_below(&self) -> usize {
        self.cpu_below
    }

    /// Where this backend's time went since it was built or [`GpuBackend::reset_profile`].
    pub fn profile(&self) -> GpuProfile {
        self.profile.snapshot()
    }

    /// Zeroes the counters of [`GpuBackend::profile`].
    pub fn reset_profile(&self) {
        self.profile.reset();
    }

    /// The adapter's name, backend and driver, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, llvmpipe)`.
    pub fn adapter_name(&self) -> String {
        self.gpu.adapter_name()
    }

    /// Which `dot4` the kernel uses: `dot4I8Packed`, `shift-extend` or `custom`.
    pub fn kernel_name(&self) -> &'static str {
        self.kernel_name
    }

    /// Whether the instance implements WGSL's `packed_4x8_integer_dot_product` extension.
    pub fn has_packed_dot(&self) -> bool {
        self.gpu.packed_dot
    }

    /// Uploads row-major int8 weights `b` (N x K) once; the handle keeps them on the device.
    /// The copy is queued and overlaps with work already submitted.
    pub fn upload(&self, b: &[i8], n: usize, k: usize) -> Result<GpuWeights> {
        check_len("b", b.len(), n, k)?;
        check_k(k)?;
        let packed = kernel::pack_rows(b, n, k);
        let bytes = packed.len().max(16) as u64;
        if bytes > self.gpu.max_binding {
            return Err(Error::TooLarge {
                what: "weights",
                bytes,
                limit: self.gpu.max_binding,
            });
        }
        let buffer = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("weights"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if !packed.is_empty() {
            self.gpu.queue.write_buffer(&buffer, 0, &packed);
        }
        self.gpu.take_error()?;
        Ok(GpuWeights {
            buffer,
            n,
            k,
            backend: self.id,
            id: next_id(),
        })
    }

    /// `acc[t, n] = Σ_k a[t, k] · w[n, k]` in i32 for row-major `a` (T x K) and resident weights.
    pub fn gemm_i8_resident(&self, a: &[i8], t: usize, w: &GpuWeights) -> Result<Vec<i32>> {
        let mut out = vec![0; t * w.n];
        self.gemm_i8_resident_into(a, t, w, &mut out)?;
        Ok(out)
    }

    /// [`GpuBackend::gemm_i8_resident`] into a caller's `t x n` buffer.
    pub fn gemm_i8_resident_into(
        &self,
        a: &[i8],
        t: usize,
        w: &GpuWeights,
        out: &mut [i32],
    ) -> Result<()> {
        if w.backend != self.id {
            return Err(Error::ForeignWeights { id: w.id });
        }
        self.run(a, t, DeviceRhs::Resident(w), w.n, w.k, out)
    }

    /// The same GEMM with B given per call (an activation operand: attention's K rows or Vᵀ rows).
    pub fn gemm_i8(&self, a: &[i8], t: usize, b: &[i8], n: usize, k: usize) -> Result<Vec<i32>> {
        let mut out = vec![0; t * n];
        self.gemm_i8_into(a, t, b, n, k, &mut out)?;
        Ok(out)
    }

    /// [`GpuBackend::gemm_i8`] into a caller's `t x n` buffer. B goes into a reused device buffer.
    pub fn gemm_i8_into(
        &self,
        a: &[i8],
        t: usize,
        b: &[i8],
        n: usize,
        k: usize,
        out: &mut [i32],
    ) -> Result<()> {
        check_len("b", b.len(), n, k)?;
        check_k(k)?;
        let packed = kernel::pack_rows(b, n, k);
        let bytes = packed.len() as u64;
        if bytes > self.gpu.max_binding {
            return Err(Error::TooLarge {
                what: "operand b",
                bytes,
                limit: self.gpu.max_binding,
            });
        }
        self.run(a, t, DeviceRhs::Packed { bytes: &packed, n }, n, k, out)
    }

    /// Checks shapes, splits A into calls that fit one binding, and dispatches each.
    fn run(
        &self,
        a: &[i8],
        t: usize,
        rhs: DeviceRhs<'_>,
        n: usize,
        k: usize,
        out: &mut [i32],
    ) -> Result<()> {
        check_len("a", a.len(), t, k)?;
        check_k(k)?;
        if out.len() != t * n {
            return Err(Error::ShapeMismatch {
                operand: "out",
                got: out.len(),
                expected: t * n,
            });
        }
        if t == 0 || n == 0 || k == 0 {
            out.fill(0);
            return Ok(());
        }
        let rows_per_call = self.rows_per_call(n, k)?;
        let mut scratch = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        for (chunk, part) in a
            .chunks(rows_per_call * k)
            .zip(out.chunks_mut(rows_per_call * n))
        {
            let rows = chunk.len() / k;
            let packed = kernel::pack_rows(chunk, rows, k);
            let rhs = match &rhs {
                DeviceRhs::Resident(w) => DeviceRhs::Resident(w),
                DeviceRhs::Packed { bytes, n } => DeviceRhs::Packed { bytes, n: *n },
            };
            let job = DeviceJob {
                a_packed: &packed,
                t: rows,
                rhs,
                k,
            };
            kernel::dispatch(
                &self.gpu,
                &self.pipeline,
                &mut scratch,
                &self.profile,
                std::slice::from_ref(&job),
                self.tuning,
                &mut [part],
            )?;
        }
        Ok(())
    }

    /// The most rows of A one dispatch takes: A's rows and the output's each fit one binding.
    fn rows_per_call(&self, n: usize, k: usize) -> Result<usize> {
        let row_bytes = (n * 4).max(kernel::row_bytes(k)) as u64;
        match (self.gpu.max_binding / row_bytes) as usize {
            0 => Err(Error::TooLarge {
                what: "one output row",
                bytes: row_bytes,
                limit: self.gpu.max_binding,
            }),
            rows => Ok(rows),
        }
    }

    /// Independent products in one submission (one round trip): each item's accumulators as
    /// [`GpuBackend::gemm_i8_resident_into`] or [`GpuBackend::gemm_i8_into`] gives them. Items too
    /// large for one dispatch, or empty, run on their own.
    fn run_batch(&self, items: &mut [BatchItem<'_>]) -> Result<()> {
        let mut alone = Vec::new();
        let mut weights = Vec::new();
        let mut packed_b = Vec::new();
        let mut together = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let (n, k, t) = (item.b.n(), item.b.k(), item.a.rows());
            check_k(k)?;
            let fits = t > 0
                && n > 0
                && k > 0
                && t <= self.rows_per_call(n, k)?
                && (n * kernel::row_bytes(k)) as u64 <= self.gpu.max_binding;
            if !fits {
                alone.push(i);
                continue;
            }
            match item.b {
                Rhs::Weights(w) => weights.push(Some(self.weights_for(w)?)),
                Rhs::Activation(_) => weights.push(None),
            }
            packed_b.push(match item.b {
                Rhs::Weights(_) => Vec::new(),
                Rhs::Activation(q) => kernel::pack_rows(q.q(), q.rows(), q.k()),
            });
            together.push((i, kernel::pack_rows(item.a.q(), t, k)));
        }
        if !together.is_empty() {
            let jobs: Vec<DeviceJob<'_>> = together
                .iter()
                .zip(&weights)
                .zip(&packed_b)
                .map(|(((i, a_packed), w), b)| DeviceJob {
                    a_packed,
                    t: items[*i].a.rows(),
                    rhs: match w {
                        Some(w) => DeviceRhs::Resident(w),
                        None => DeviceRhs::Packed {
                            bytes: b,
                            n: items[*i].b.n(),
                        },
                    },
                    k: items[*i].b.k(),
                })
                .collect();
            let mut outs: Vec<&mut [i32]> = Vec::with_capacity(jobs.len());
            let mut next = together.iter().map(|(i, _)| *i).peekable();
            for (i, item) in items.iter_mut().enumerate() {
                if next.peek() == Some(&i) {
                    next.next();
                    outs.push(&mut *item.out);
                }
            }
            let mut scratch = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
            kernel::dispatch(
                &self.gpu,
                &self.pipeline,
                &mut scratch,
                &self.profile,
                &jobs,
                self.tuning,
                &mut outs,
            )?;
        }
        for i in alone {
            let item = &mut items[i];
            self.gemm_rhs(item.a, item.b, item.out)?;
        }
        Ok(())
    }
}

impl GpuBackend {
    /// The device copy of `w`, uploaded on first use and kept until [`GpuBackend::evict`].
    pub fn weights_for(&self, w: &PackedWeights) -> Result<Arc<GpuWeights>> {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(g) = cache.get(&w.id()) {
            return Ok(Arc::clone(g));
        }
        let q = w.to_quantized();
        let g = Arc::new(self.upload(q.q(), q.rows(), q.k())?);
        cache.insert(w.id(), Arc::clone(&g));
        Ok(g)
    }

    /// Drops the device copy of the weights with this [`PackedWeights::id`], if any.
    pub fn evict(&self, id: u64) {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// Drops every cached device copy of [`PackedWeights`].
    pub fn clear_cache(&self) {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Bytes of [`PackedWeights`] copies held on the device.
    pub fn cached_bytes(&self) -> u64 {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|g| g.device_bytes())
            .sum()
    }

    fn gemm_rhs(&self, a: &Quantized, b: Rhs<'_>, out: &mut [i32]) -> Result<()> {
        match b {
            Rhs::Weights(w) => {
                self.gemm_i8_resident_into(a.q(), a.rows(), self.weights_for(w)?.as_ref(), out)
            }
            Rhs::Activation(q) => self.gemm_i8_into(a.q(), a.rows(), q.q(), q.rows(), q.k(), out),
        }
    }
}

/// The `daisy-gemm-int8` backend: the GPU returns the i32 accumulators (products below
/// [`GpuBackend::cpu_below`] multiply-adds come from the CPU kernels, the same integers without a
/// round trip); dequantization, audit and probe are the shared CPU code.
impl Backend for GpuBackend {
    fn name(&self) -> String {
        format!("wgpu:{}", self.adapter_name())
    }

    fn gemm_i32_batch(&self, items: &mut [BatchItem<'_>]) -> Result<(), daisy_gemm_int8::Error> {
        let mut on_gpu = Vec::with_capacity(items.len());
        for item in items.iter_mut() {
            daisy_gemm_int8::check_shapes(item.a, item.b, item.out)?;
            if !self.ran_on_cpu(item.a, item.b, item.out)? {
                on_gpu.push(BatchItem {
                    a: item.a,
                    b: item.b,
                    out: &mut *item.out,
                });
            }
        }
        self.run_batch(&mut on_gpu)
            .map_err(|e| self.as_gemm_error(e))
    }

    fn keep_resident(&self, w: &PackedWeights) -> Result<(), daisy_gemm_int8::Error> {
        if w.n() * w.k() == 0 {
            return Ok(());
        }
        self.weights_for(w)
            .map(|_| ())
            .map_err(|e| self.as_gemm_error(e))
    }

    fn profile(&self) -> Option<String> {
        Some(GpuBackend::profile(self).to_string())
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn gemm_i32(
        &self,
        a: &Quantized,
        b: Rhs<'_>,
        out: &mut [i32],
    ) -> Result<(), daisy_gemm_int8::Error> {
        daisy_gemm_int8::check_shapes(a, b, out)?;
        if self.ran_on_cpu(a, b, out)? {
            return Ok(());
        }
        self.gemm_rhs(a, b, out).map_err(|e| self.as_gemm_error(e))
    }
}

impl GpuBackend {
    /// Runs a product below [`GpuBackend::cpu_below`] multiply-adds on the CPU kernels; `false`
    /// (and nothing done) for a larger one.
    fn ran_on_cpu(
        &self,
        a: &Quantized,
        b: Rhs<'_>,
        out: &mut [i32],
    ) -> Result<bool, daisy_gemm_int8::Error> {
        if a.rows() * b.n() * b.k() >= self.cpu_below {
            return Ok(false);
        }
        let start = Instant::now();
        self.cpu.gemm_i32(a, b, out)?;
        self.profile.add_cpu(start.elapsed());
        Ok(true)
    }

    /// This crate's error as the shared GEMM error, naming this backend.
    fn as_gemm_error(&self, e: Error) -> daisy_gemm_int8::Error {
        daisy_gemm_int8::Error::Backend {
            backend: Backend::name(self),
            message: e.to_string(),
        }
    }
}
