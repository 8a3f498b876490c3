//! `GpuLayers`: a stage's Llama-family layers run whole on the GPU, with the CPU's bits.
//!
//! A pass uploads the rows' hidden states once and records every layer into one submission: the
//! GEMM kernel's dispatches (weights resident, operands and accumulators in device buffers placed
//! by `Dims`) with the row kernels of `layer.wgsl` between them (dequantization, residual, RMSNorm,
//! bias, RoPE, softmax, SiLU, quantization: each the CPU's bits, `floats.wgsl`), the KV cache in
//! device memory. What comes back is the last hidden state, a flag per layer for non-finite values
//! and, for every product, two rows of A, two blocks of 16 columns of B and their accumulators:
//! the live audit of DESIGN §3.7, checked against the scalar reference here as the CPU path checks
//! its own products.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use daisy_gemm_int8::{Backend, PackedWeights, reference_cell, splitmix};
use daisy_model::{DeviceHead, DeviceKv, DeviceLayers, LayerShape, LlamaLayer};

use crate::backend::GpuBackend;
use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::floats::library_source;
use crate::kernel::{DIMS_BYTES, Grid, Pipeline, map_read, row_bytes};

/// The row kernels (`floats.wgsl` is prepended).
const LAYER_WGSL: &str = include_str!("layer.wgsl");

/// Bytes of one dispatch's parameters in the uniform buffer (WebGPU's offset alignment).
const SLOT: u64 = 256;
/// Bytes of the row kernels' `L`.
const L_BYTES: u64 = 112;
/// Words every region starts on (a vec4 word for the GEMM kernel, 256 bytes in all).
const ALIGN_WORDS: usize = 64;
/// Columns of one audited block: two blocks and two rows give 16 cells a product, as many as the
/// CPU path's audit (`daisy_gemm_int8::AUDIT_CELLS`); each column's B row is read once.
const AUDIT_BLOCK: usize = 4;
/// Segments a product's audit gathers at most (two A rows, four accumulator runs, two B blocks).
const AUDIT_SEGMENTS: usize = 8;

/// Rows of chunks a submission takes at most (a single longer chunk is a submission alone).
const GROUP_ROWS: usize = 1024;
/// Words of a group's attention scores (chunks × heads × rows × keys) at most, past one chunk.
const GROUP_ATTENTION_WORDS: usize = 1 << 24;

static AUDIT_SEED: AtomicU64 = AtomicU64::new(0x5EED_1A7E_0000_0000);

/// Words of one packed row of `k` int8 values.
fn rw(k: usize) -> usize {
    row_bytes(k) / 4
}

/// The row kernels' entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Entry {
    Residual,
    QkvRope,
    ValuesT,
    Softmax,
    AttnOut,
    Silu,
    Quantize,
    Dequant,
    Gather,
    Zero,
}

impl Entry {
    const ALL: [Entry; 10] = [
        Entry::Residual,
        Entry::QkvRope,
        Entry::ValuesT,
        Entry::Softmax,
        Entry::AttnOut,
        Entry::Silu,
        Entry::Quantize,
        Entry::Dequant,
        Entry::Gather,
        Entry::Zero,
    ];

    fn name(self) -> &'static str {
        match self {
            Entry::Residual => "residual_norm_quantize",
            Entry::QkvRope => "qkv_rope_quantize",
            Entry::ValuesT => "values_transposed_quantize",
            Entry::Softmax => "scores_softmax_quantize",
            Entry::AttnOut => "attention_out_quantize",
            Entry::Silu => "gate_up_silu",
            Entry::Quantize => "quantize_segments",
            Entry::Dequant => "dequantize_rows",
            Entry::Gather => "audit_gather",
            Entry::Zero => "zero_acc",
        }
    }
}

/// The compiled row kernels and the GEMM kernel with dynamic dims, and their layouts.
struct Pipes {
    rows: HashMap<Entry, wgpu::ComputePipeline>,
    layout: wgpu::BindGroupLayout,
    gemm: Pipeline,
}

fn layout_entry(
    binding: u32,
    ty: wgpu::BufferBindingType,
    dynamic: bool,
) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: dynamic,
            min_binding_size: None,
        },
        count: None,
    }
}

impl Pipes {
    fn new(gpu: &Gpu, gemm_source: &str, layer_source: &str) -> Result<Pipes> {
        let device = &gpu.device;
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("layer"),
            source: wgpu::ShaderSource::Wgsl(
                format!("{}\n{layer_source}", library_source()).into(),
            ),
        });
        use wgpu::BufferBindingType as T;
        let rw = T::Storage { read_only: false };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("layer"),
            entries: &[
                layout_entry(0, T::Uniform, true),
                layout_entry(1, rw, false),
                layout_entry(2, T::Storage { read_only: true }, false),
                layout_entry(3, rw, false),
                layout_entry(4, rw, false),
                layout_entry(5, rw, false),
                layout_entry(6, rw, false),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("layer"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let rows = Entry::ALL
            .into_iter()
            .map(|e| {
                let p = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(e.name()),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some(e.name()),
                    compilation_options: wgpu::PipelineCompilationOptions::default(),
                    cache: None,
                });
                (e, p)
            })
            .collect();
        gpu.take_error()?;
        let gemm = Pipeline::with_dynamic_dims(gpu, gemm_source)?;
        Ok(Pipes { rows, layout, gemm })
    }
}

/// A growable device buffer.
struct Buf {
    buffer: wgpu::Buffer,
    bytes: u64,
}

fn buffer(gpu: &Gpu, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer> {
    if bytes > gpu.max_binding {
        return Err(Error::TooLarge {
            what: "a buffer of the GPU stage",
            bytes,
            limit: gpu.max_binding,
        });
    }
    Ok(gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes.max(16),
        usage,
        mapped_at_creation: false,
    }))
}

impl Buf {
    /// Whether `b` holds `bytes`; else a new buffer of at least that (a quarter more, so that a
    /// growing window does not reallocate every pass). Returns whether it changed.
    fn ensure(
        b: &mut Option<Buf>,
        gpu: &Gpu,
        label: &str,
        bytes: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<bool> {
        if b.as_ref().is_some_and(|b| b.bytes >= bytes) {
            return Ok(false);
        }
        let want = (bytes + bytes / 4)
            .next_multiple_of(SLOT)
            .min(gpu.max_binding)
            .max(bytes);
        *b = Some(Buf {
            buffer: buffer(gpu, label, want, usage)?,
            bytes: want,
        });
        Ok(true)
    }
}

/// The stage's constants on the device: norm weights, biases and weight scales, per layer.
struct Consts {
    ids: Vec<u64>,
    buffer: wgpu::Buffer,
    layers: Vec<LayerConsts>,
    /// The final norm's weight and the lm_head's scales, for a stage that ends the model.
    head: Option<(u32, u32)>,
}

#[derive(Clone, Copy)]
struct LayerConsts {
    in_norm: u32,
    post_norm: u32,
    bias: Option<u32>,
    s_qkv: u32,
    s_o: u32,
    s_gu: u32,
    s_down: u32,
}

impl Consts {
    fn ids(layers: &[LlamaLayer<'_>], head: Option<&DeviceHead<'_>>) -> Vec<u64> {
        layers
            .iter()
            .flat_map(|l| [l.qkv.id(), l.o.id(), l.gate_up.id(), l.down.id()])
            .chain(head.map(|h| h.lm_head.id()))
            .collect()
    }

    fn new(gpu: &Gpu, layers: &[LlamaLayer<'_>], head: Option<&DeviceHead<'_>>) -> Result<Consts> {
        let mut words: Vec<u32> = Vec::new();
        let mut put = |v: &[f32]| -> u32 {
            let at = words.len();
            words.extend(v.iter().map(|x| x.to_bits()));
            words.resize(words.len().next_multiple_of(ALIGN_WORDS), 0);
            at as u32
        };
        let placed = layers
            .iter()
            .map(|l| LayerConsts {
                in_norm: put(l.input_norm),
                post_norm: put(l.post_norm),
                bias: l.qkv_bias.map(&mut put),
                s_qkv: put(l.qkv.scales()),
                s_o: put(l.o.scales()),
                s_gu: put(l.gate_up.scales()),
                s_down: put(l.down.scales()),
            })
            .collect();
        let head_consts = head.map(|h| (put(h.norm), put(h.lm_head.scales())));
        let bytes = (words.len() * 4) as u64;
        let buf = buffer(
            gpu,
            "layer constants",
            bytes,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        )?;
        gpu.queue
            .write_buffer(&buf, 0, bytemuck::cast_slice(&words));
        Ok(Consts {
            ids: Consts::ids(layers, head),
            buffer: buf,
            layers: placed,
            head: head_consts,
        })
    }
}

/// Buffers reused across passes, and the bind groups that depend on them.
#[derive(Default)]
struct Work {
    fl: Option<Buf>,
    ops: Option<Buf>,
    acc: Option<Buf>,
    params: Option<Buf>,
    readback: Option<Buf>,
    consts: Option<Consts>,
    /// GEMM bind groups against resident weights (by `PackedWeights::id`) and against `ops`.
    weight_groups: HashMap<u64, wgpu::BindGroup>,
    ops_group: Option<wgpu::BindGroup>,
}

/// A KV cache in device memory: per layer, the key rows packed (`kq`: `[g][cap]` rows of
/// `rw(head_dim)` words) and the key scales and f32 values (`kf`: `[g][cap]` scales, then
/// `[g][cap][head_dim]` values).
pub struct GpuKv {
    layers: usize,
    len: usize,
    cap: usize,
    /// (kv heads, head_dim) once allocated.
    dims: Option<(usize, usize)>,
    kq: Option<wgpu::Buffer>,
    kf: Option<wgpu::Buffer>,
}

impl std::fmt::Debug for GpuKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuKv")
            .field("layers", &self.layers)
            .field("len", &self.len)
            .field("cap", &self.cap)
            .finish()
    }
}

impl DeviceKv for GpuKv {
    fn len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl GpuKv {
    fn new(layers: usize) -> GpuKv {
        GpuKv {
            layers,
            len: 0,
            cap: 0,
            dims: None,
            kq: None,
            kf: None,
        }
    }

    /// Words of one layer in `kq` and in `kf` at capacity `cap`.
    fn strides(g: usize, hd: usize, cap: usize) -> (usize, usize) {
        (g * cap * rw(hd), g * cap * (1 + hd))
    }

    /// Room for `need` positions of `g` kv heads of `hd`; what is held is copied over.
    fn ensure(&mut self, gpu: &Gpu, g: usize, hd: usize, need: usize) -> Result<()> {
        if self.dims.is_some_and(|d| d != (g, hd)) {
            return Err(Error::ShapeMismatch {
                operand: "the KV cache's heads",
                got: g * hd,
                expected: self.dims.map_or(0, |(g, hd)| g * hd),
            });
        }
        if need <= self.cap && self.kq.is_some() {
            return Ok(());
        }
        let cap = need.max(2 * self.cap).max(64).next_multiple_of(16);
        let (sq, sf) = GpuKv::strides(g, hd, cap);
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        let kq = buffer(gpu, "kv keys", (self.layers * sq * 4) as u64, usage)?;
        let kf = buffer(gpu, "kv values", (self.layers * sf * 4) as u64, usage)?;
        if let (Some(old_q), Some(old_f), true) = (&self.kq, &self.kf, self.len > 0) {
            let (oq, of) = GpuKv::strides(g, hd, self.cap);
            let mut enc = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("kv grow"),
                });
            let w = |words: usize| (words * 4) as u64;
            for l in 0..self.layers {
                for h in 0..g {
                    let rows = self.len;
                    let (src, dst) = (l * oq + h * self.cap * rw(hd), l * sq + h * cap * rw(hd));
                    enc.copy_buffer_to_buffer(old_q, w(src), &kq, w(dst), w(rows * rw(hd)));
                    let (src, dst) = (l * of + h * self.cap, l * sf + h * cap);
                    enc.copy_buffer_to_buffer(old_f, w(src), &kf, w(dst), w(rows));
                    let (src, dst) = (
                        l * of + g * self.cap + h * self.cap * hd,
                        l * sf + g * cap + h * cap * hd,
                    );
                    enc.copy_buffer_to_buffer(old_f, w(src), &kf, w(dst), w(rows * hd));
                }
            }
            gpu.queue.submit([enc.finish()]);
        }
        self.kq = Some(kq);
        self.kf = Some(kf);
        self.cap = cap;
        self.dims = Some((g, hd));
        Ok(())
    }
}

/// Where B of an audited product lies.
enum AuditB<'a> {
    /// Resident weights: the CPU holds the same rows.
    Weights(&'a PackedWeights),
    /// Gathered with the rest, after the accumulators (rows of `rw(k)` words).
    Rows,
}

/// One product's audit: the cells of rows `rows` and columns `cols` (start, width), gathered.
struct Audit<'a> {
    what: String,
    k: usize,
    rows: [usize; 2],
    cols: [(usize, usize); 2],
    /// Words in the audit region: A's rows, then the four accumulator runs, then B's blocks.
    at: usize,
    b: AuditB<'a>,
}

/// Where a GEMM's B lies.
#[derive(Clone, Copy)]
enum Rhs<'a> {
    Weights(&'a PackedWeights),
    /// Packed rows in `ops` at this word.
    Ops(usize),
    /// Packed rows in the KV cache's `kq` at this word.
    Kv(usize),
}

/// One product `acc[c..] = A·Bᵀ` (words): `t` rows of A packed in `ops` at `a` (K = `k`) against
/// `n` rows of B.
#[derive(Clone, Copy)]
struct Product<'a> {
    a: usize,
    t: usize,
    k: usize,
    b: Rhs<'a>,
    n: usize,
    c: usize,
}

impl<'a> Product<'a> {
    /// The `i`-th product of `batch`, whose first is this one.
    fn of_batch(self, i: usize, batch: &Batch) -> Product<'a> {
        let b = match self.b {
            Rhs::Weights(w) => Rhs::Weights(w),
            Rhs::Ops(at) => Rhs::Ops(at + batch.b_index(i) * batch.b),
            Rhs::Kv(at) => Rhs::Kv(at + batch.b_index(i) * batch.b),
        };
        Product {
            a: self.a + i * batch.a,
            b,
            c: self.c + i * batch.c,
            ..self
        }
    }
}

enum Cmd {
    Row {
        entry: Entry,
        slot: u32,
        groups: (u32, u32),
    },
    Gemm {
        group: GemmGroup,
        slot: u32,
        grid: Grid,
        /// Which product, for the profile ("gemv q/k/v projection", ...).
        kind: String,
    },
}

impl Cmd {
    fn label(&self) -> String {
        match self {
            Cmd::Row { entry, .. } => entry.name().to_string(),
            Cmd::Gemm { kind, .. } => kind.clone(),
        }
    }
}

#[derive(Clone, Copy)]
enum GemmGroup {
    Weights(u64),
    Ops,
    Kv,
}

/// Products of one shape in one dispatch: how many, and the words from one's A, B and output to
/// the next's.
#[derive(Clone, Copy)]
struct Batch {
    count: usize,
    a: usize,
    b: usize,
    c: usize,
    /// B's batch index is the batch's modulo this (0: the batch's own).
    b_mod: usize,
}

impl Batch {
    const ONE: Batch = Batch {
        count: 1,
        a: 0,
        b: 0,
        c: 0,
        b_mod: 0,
    };

    fn b_index(&self, i: usize) -> usize {
        if self.b_mod > 0 { i % self.b_mod } else { i }
    }
}

/// A pass's commands as they are recorded: parameters, audits and the gather table.
struct Recorder<'a> {
    params: Vec<u8>,
    cmds: Vec<Cmd>,
    audits: Vec<Audit<'a>>,
    /// (source: 0 acc, 1 ops, 2 kq; source word; destination word in `fl`; words).
    gather: Vec<[u32; 4]>,
    audit_words: usize,
    /// The first gather segment not yet dispatched.
    pending: usize,
    /// Where the audit region and the gather table start in `fl`.
    audit0: usize,
    gtab0: usize,
    seed: u64,
    tuning: crate::kernel::Tuning,
    dispatches: (usize, usize),
}

fn grid_of(rows: usize) -> (u32, u32) {
    let x = rows.clamp(1, 65535);
    (x as u32, rows.div_ceil(x) as u32)
}

impl<'a> Recorder<'a> {
    fn slot(&mut self, words: &[u32]) -> u32 {
        let at = self.params.len();
        self.params
            .extend(words.iter().flat_map(|w| w.to_le_bytes()));
        self.params.resize(at + SLOT as usize, 0);
        at as u32
    }

    /// A row kernel over `rows` rows with parameters p0.. = `p`.
    fn row(&mut self, entry: Entry, rows: usize, p: &[u32]) {
        let mut words = vec![rows as u32, 1.0f32.to_bits()];
        words.extend_from_slice(p);
        let slot = self.slot(&words);
        self.cmds.push(Cmd::Row {
            entry,
            slot,
            groups: grid_of(rows),
        });
    }

    fn random(&mut self, below: usize) -> usize {
        (splitmix(&mut self.seed) % below.max(1) as u64) as usize
    }

    /// `p`, audited.
    fn gemm(&mut self, what: String, p: Product<'a>) {
        self.gemms(&|_| what.clone(), p, Batch::ONE);
    }

    /// `batch.count` products of one shape in one dispatch, the first `p`, the i-th with its
    /// operands and output `i` strides (words) after the first's; each audited as its own product,
    /// named by `what(i)`.
    fn gemms(&mut self, what: &dyn Fn(usize) -> String, p: Product<'a>, batch: Batch) {
        let Product { a, t, k, b, n, c } = p;
        let count = batch.count.max(1);
        let grid = Grid::batched(t, n, k, self.tuning, count);
        if grid.adds() {
            // The outputs of a batch lie `batch.c` apart; zero the whole span.
            let span = (count - 1) * batch.c + t * n;
            self.row(Entry::Zero, span.div_ceil(256), &[c as u32, span as u32]);
        }
        let (group, b0) = match b {
            Rhs::Weights(w) => (GemmGroup::Weights(w.id()), 0),
            Rhs::Ops(at) => (GemmGroup::Ops, at),
            Rhs::Kv(at) => (GemmGroup::Kv, at),
        };
        let k16 = rw(k) / 4;
        let dims = [
            t as u32,
            n as u32,
            k16 as u32,
            grid.stages,
            (a / 4) as u32,
            (b0 / 4) as u32,
            c as u32,
            count as u32,
            (batch.a / 4) as u32,
            (batch.b / 4) as u32,
            batch.c as u32,
            batch.b_mod as u32,
        ];
        let slot = self.slot(&dims);
        match grid.gemv {
            true => self.dispatches.0 += 1,
            false => self.dispatches.1 += 1,
        }
        // "layer 3 attention scores of kv head 1" -> "attention scores"
        let name = what(0);
        let product = name
            .split_once(' ')
            .and_then(|(_, r)| r.split_once(' '))
            .map_or(&*name, |(_, r)| r);
        let product = product.split(" of kv head").next().unwrap_or(product);
        let kind = format!("{} {product}", if grid.gemv { "gemv" } else { "tiled" });
        self.cmds.push(Cmd::Gemm {
            group,
            slot,
            grid,
            kind,
        });
        for i in 0..count {
            self.audit(what(i), p.of_batch(i, &batch));
        }
    }

    /// The audit of one product: two rows, two blocks of columns, their cells and operands gathered.
    fn audit(&mut self, what: String, p: Product<'a>) {
        let Product { a, t, k, b, n, c } = p;
        let rows = [self.random(t), self.random(t)];
        let blocks = n.div_ceil(AUDIT_BLOCK);
        let cols = [0, 1].map(|_| {
            let start = self.random(blocks) * AUDIT_BLOCK;
            (start, AUDIT_BLOCK.min(n - start))
        });
        let at = self.audit_words;
        let mut dst = self.audit0 + at;
        let mut seg = |src: u32, from: usize, words: usize, gather: &mut Vec<[u32; 4]>| {
            gather.push([src, from as u32, dst as u32, words as u32]);
            dst += words;
        };
        for r in rows {
            seg(1, a + r * rw(k), rw(k), &mut self.gather);
        }
        for r in rows {
            for (start, width) in cols {
                seg(0, c + r * n + start, width, &mut self.gather);
            }
        }
        let audit_b = match b {
            Rhs::Weights(w) => AuditB::Weights(w),
            Rhs::Ops(at) | Rhs::Kv(at) => {
                let src = if matches!(b, Rhs::Ops(_)) { 1 } else { 2 };
                for (start, width) in cols {
                    seg(src, at + start * rw(k), width * rw(k), &mut self.gather);
                }
                AuditB::Rows
            }
        };
        self.audit_words = dst - self.audit0;
        self.audits.push(Audit {
            what,
            k,
            rows,
            cols,
            at,
            b: audit_b,
        });
    }
}

impl Recorder<'_> {
    /// One gather dispatch for every audit segment recorded since the last.
    fn flush_audit(&mut self) {
        let segments = self.gather.len() - self.pending;
        if segments > 0 {
            let table = (self.gtab0 + 4 * self.pending) as u32;
            self.row(Entry::Gather, segments, &[table]);
            self.pending = self.gather.len();
        }
    }
}

/// Words of a product's audit at most.
fn audit_bound(k: usize, b_rows: bool) -> usize {
    2 * rw(k) + 4 * AUDIT_BLOCK + if b_rows { 2 * AUDIT_BLOCK * rw(k) } else { 0 }
}

/// Where everything of one pass lies (words).
struct Regions {
    /// Each row's chunk, and each chunk's first row, rows, first position and keys (fl).
    rtab: usize,
    ctab: usize,
    /// The head's logits and operand scales (fl), operands (ops) and accumulators (acc).
    logits: usize,
    s_head: usize,
    a_head: usize,
    acc_head: usize,
    // fl
    x: usize,
    flags: usize,
    audit: usize,
    gtab: usize,
    cos: usize,
    s_in: usize,
    s_post: usize,
    q_s: usize,
    vt_s: usize,
    p_s: usize,
    attn_s: usize,
    act_s: usize,
    /// The segments' max |y| of rows quantized by `quantize_segments`.
    seg_max: usize,
    scratch: usize,
    fl: usize,
    // ops
    a_in: usize,
    a_post: usize,
    q: usize,
    vt: usize,
    p: usize,
    attn: usize,
    act: usize,
    ops: usize,
    // acc: each product of a layer its own
    acc_qkv: usize,
    acc_scores: usize,
    acc_values: usize,
    acc_o: usize,
    acc_gu: usize,
    acc_down: usize,
    acc: usize,
}

struct Cursor(usize);

impl Cursor {
    fn take(&mut self, words: usize) -> usize {
        let at = self.0;
        self.0 = (self.0 + words).next_multiple_of(ALIGN_WORDS);
        at
    }
}

impl Regions {
    /// For `passes` chunks of at most `t` rows, `total` rows in all, `nk` keys at the end. The
    /// row-wise operands hold every row (the products run over all of them at once); attention's
    /// are laid out chunk after chunk, `t` rows a head and `nk` keys a row each.
    /// With `head` (rows, vocabulary), the head's operands and logits.
    #[allow(clippy::too_many_arguments)]
    fn new(
        s: &LayerShape,
        layers: usize,
        t: usize,
        nk: usize,
        total: usize,
        passes: usize,
        head: Option<(usize, usize)>,
    ) -> Regions {
        let (hr, vocab) = head.unwrap_or((0, 0));
        let (h, hd, heads, g, i) = (s.hidden, s.head_dim, s.heads, s.kv_heads, s.intermediate);
        let qd = heads * hd;
        let w = qd + 2 * g * hd;
        let per_layer = audit_bound(h, false) * 2
            + audit_bound(qd, false)
            + audit_bound(i, false)
            + passes * g * (audit_bound(hd, true) + audit_bound(nk, true))
            + audit_bound(h, false);
        let gemms = layers * (4 + passes * 2 * g) + 1;
        let mut f = Cursor(0);
        let x = f.take(total * h);
        let flags = f.take(layers);
        let logits = f.take(hr * vocab);
        let s_head = f.take(hr);
        let audit = f.take(layers * per_layer);
        let gtab = f.take(gemms * AUDIT_SEGMENTS * 4);
        let cos = f.take(total * hd);
        let rtab = f.take(total);
        let ctab = f.take(passes * 4);
        let s_in = f.take(total);
        let s_post = f.take(total);
        let q_s = f.take(passes * heads * t);
        let vt_s = f.take(passes * g * hd);
        let p_s = f.take(passes * heads * t);
        let attn_s = f.take(total);
        let act_s = f.take(total);
        let seg_max = f.take(total * i.div_ceil(256));
        let scratch = f.take(
            [
                total * h,
                total * (heads + g) * hd,
                passes * g * hd * nk,
                passes * heads * t * nk,
                total * qd,
                total * i,
            ]
            .into_iter()
            .max()
            .unwrap_or(0),
        );
        let mut o = Cursor(0);
        let a_in = o.take(total * rw(h));
        let a_post = o.take(total * rw(h));
        let q = o.take(passes * heads * t * rw(hd));
        let vt = o.take(passes * g * hd * rw(nk));
        let p = o.take(passes * heads * t * rw(nk));
        let attn = o.take(total * rw(qd));
        let act = o.take(total * rw(i));
        let a_head = o.take(hr * rw(h));
        let mut a = Cursor(0);
        let acc_qkv = a.take(total * w);
        let acc_scores = a.take(passes * heads * t * nk);
        let acc_values = a.take(passes * heads * t * hd);
        let acc_o = a.take(total * h);
        let acc_gu = a.take(total * 2 * i);
        let acc_down = a.take(total * h);
        let acc_head = a.take(hr * vocab);
        Regions {
            rtab,
            ctab,
            x,
            flags,
            logits,
            s_head,
            a_head,
            acc_head,
            audit,
            gtab,
            cos,
            s_in,
            s_post,
            q_s,
            vt_s,
            p_s,
            attn_s,
            act_s,
            seg_max,
            scratch,
            fl: f.0,
            a_in,
            a_post,
            q,
            vt,
            p,
            attn,
            act,
            ops: o.0,
            acc_qkv,
            acc_scores,
            acc_values,
            acc_o,
            acc_gu,
            acc_down,
            acc: a.0,
        }
    }
}

fn whole(binding: u32, b: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: b.as_entire_binding(),
    }
}

/// Where a pass's operands lie: its regions, chunks, positions and the KV cache's layout.
struct Placement<'p, 'a> {
    /// The head's final norm and lm_head, with the norm's and scales' places in the constants.
    head: Option<(&'p DeviceHead<'a>, (u32, u32))>,
    r: &'p Regions,
    /// The rows of each chunk, in order, from position `pos0`.
    chunks: &'p [usize],
    pos0: usize,
    cap: usize,
    kq_stride: usize,
    kf_stride: usize,
}

/// Records every layer of a pass, layer after layer: the row-wise steps and the weight products
/// over every row at once, attention chunk by chunk (each chunk's keys are those before it and its
/// own: the same bits as a pass a chunk, as every other step is row by row); the layer's audit
/// gathered once at its end, and the last residual addition. The row kernels' parameters are
/// positional (`layer.wgsl` names them p0, p1, ... in each kernel's comment).
#[rustfmt::skip]
fn record<'a>(
    rec: &mut Recorder<'a>,
    s: &LayerShape,
    layers: &[LlamaLayer<'a>],
    consts: &[LayerConsts],
    at: &Placement<'_, 'a>,
) -> std::result::Result<(), daisy_model::Error> {
    let Placement { head, r, chunks, pos0, cap, kq_stride, kf_stride } = *at;
    let (h, hd, heads, g, inter) = (s.hidden, s.head_dim, s.heads, s.kv_heads, s.intermediate);
    let (group, qd) = (heads / g, heads * hd);
    let w = qd + 2 * g * hd;
    let u = |v: usize| v as u32;
    let eps = s.eps.to_bits();
    let total: usize = chunks.iter().sum();
    let tmax = chunks.iter().copied().max().unwrap_or(0);
    let nk = pos0 + total;
    let x = r.x;
    for (l, (layer, c)) in layers.iter().zip(consts).enumerate() {
        let name = |what: &str| format!("layer {} {what}", layer.index);
        let window = match layer.window {
            Some(0) => {
                return Err(daisy_model::Error::Invalid(format!(
                    "layer {} has a sliding window of 0",
                    layer.index
                )));
            }
            Some(win) => win,
            None => 0,
        };
        // The previous layer's down product added (none before the first), the input norm, the
        // q/k/v operand.
        let (add, sb, flag) = match l {
            0 => (0, 0, r.flags),
            _ => (1, consts[l - 1].s_down, r.flags + l - 1),
        };
        rec.row(Entry::Residual, total, &[
            u(h), eps, u(rw(h)), add, u(x), u(r.acc_down), u(r.act_s), sb, 1, c.in_norm,
            u(r.scratch), u(r.a_in), u(r.s_in), u(flag),
        ]);
        rec.gemm(name("q/k/v projection"), Product { a: r.a_in, t: total, k: h, b: Rhs::Weights(layer.qkv), n: w, c: r.acc_qkv });
        let (kq0, kf0) = (l * kq_stride, l * kf_stride);
        // Attention, every chunk in each dispatch: a chunk's operands are TQ rows a head and NK
        // keys a row (its own keys, zero past them: the products' sums are the chunk's alone).
        let (tq, nkk, passes) = (tmax, nk, chunks.len());
        rec.row(Entry::QkvRope, total, &[
            u(heads), u(g), u(hd), u32::from(c.bias.is_some()), u(rw(hd)), u(r.acc_qkv), u(r.s_in),
            c.s_qkv, c.bias.unwrap_or(0), u(r.cos), u(r.scratch), u(r.q), u(r.q_s), u(kq0), u(kf0),
            u(kf0 + g * cap), u(cap), u(pos0), u(r.rtab), u(r.ctab), u(tq),
        ]);
        rec.row(Entry::ValuesT, passes * g * hd, &[
            u(nkk), u(hd), u(rw(nkk)), u(kf0 + g * cap), u(cap), u(r.scratch), u(r.vt), u(r.vt_s),
            u(g * hd), u(r.ctab),
        ]);
        let chunk_head = |what: &str, i: usize| name(&format!("attention {what} of kv head {} in chunk {}", i % g, i / g));
        rec.gemms(
            &|i| chunk_head("scores", i),
            Product { a: r.q, t: group * tq, k: hd, b: Rhs::Kv(kq0), n: nkk, c: r.acc_scores },
            Batch { count: passes * g, a: group * tq * rw(hd), b: cap * rw(hd), c: group * tq * nkk, b_mod: g },
        );
        rec.row(Entry::Softmax, passes * heads * tq, &[
            u(nkk), s.attn_scale.to_bits(), u(rw(nkk)), u(tq), u(r.ctab), u(window), u(r.acc_scores),
            u(r.q_s), u(kf0), u(group), u(cap), u(r.scratch), u(r.p), u(r.p_s), u(heads),
        ]);
        rec.gemms(
            &|i| chunk_head("values", i),
            Product { a: r.p, t: group * tq, k: nkk, b: Rhs::Ops(r.vt), n: hd, c: r.acc_values },
            Batch { count: passes * g, a: group * tq * rw(nkk), b: hd * rw(nkk), c: group * tq * hd, b_mod: 0 },
        );
        rec.row(Entry::AttnOut, total, &[
            u(heads), u(g), u(hd), u(rw(qd)), u(r.acc_values), u(r.p_s), u(r.vt_s), u(r.scratch),
            u(r.attn), u(r.attn_s), u(r.rtab), u(r.ctab), u(tq),
        ]);
        rec.gemm(name("attention output projection"), Product { a: r.attn, t: total, k: qd, b: Rhs::Weights(layer.o), n: h, c: r.acc_o });
        rec.row(Entry::Residual, total, &[
            u(h), eps, u(rw(h)), 1, u(x), u(r.acc_o), u(r.attn_s), c.s_o, 1, c.post_norm,
            u(r.scratch), u(r.a_post), u(r.s_post), u(r.flags + l),
        ]);
        rec.gemm(name("gate/up projection"), Product { a: r.a_post, t: total, k: h, b: Rhs::Weights(layer.gate_up), n: 2 * inter, c: r.acc_gu });
        // SiLU a segment of 256 values a workgroup, then the rows quantized a block of 256 words
        // a workgroup.
        let (segs, blocks) = (inter.div_ceil(256), rw(inter).div_ceil(256));
        rec.row(Entry::Silu, total * segs, &[
            u(inter), 0, u(r.acc_gu), u(r.s_post), c.s_gu, u(r.scratch), 0, 0, u(segs),
            u(r.seg_max),
        ]);
        rec.row(Entry::Quantize, total * blocks, &[
            u(inter), u(rw(inter)), u(r.scratch), u(r.seg_max), u(segs), u(r.act), u(blocks),
            u(r.act_s),
        ]);
        rec.gemm(name("down projection"), Product { a: r.act, t: total, k: inter, b: Rhs::Weights(layer.down), n: h, c: r.acc_down });
        // Every product of the layer (every chunk's attention included) has its own operands and
        // accumulators until the next layer writes them: one gather for all of their audits.
        rec.flush_audit();
    }
    if let Some(last) = consts.last() {
        rec.row(Entry::Residual, total, &[
            u(h), eps, u(rw(h)), 1, u(x), u(r.acc_down), u(r.act_s), last.s_down, 0, 0, 0, 0, 0,
            u(r.flags + layers.len() - 1),
        ]);
    }
    // The head's final norm and lm_head over the last rows, the logits dequantized.
    if let Some((hd, (norm, s_lm))) = head {
        let (hr, vocab) = (hd.rows, hd.lm_head.n());
        rec.row(Entry::Residual, hr, &[
            u(h), eps, u(rw(h)), 0, u(x + (total - hr) * h), 0, 0, 0, 1, norm, u(r.scratch),
            u(r.a_head), u(r.s_head), 0,
        ]);
        rec.gemm("the lm_head".to_string(), Product { a: r.a_head, t: hr, k: h, b: Rhs::Weights(hd.lm_head), n: vocab, c: r.acc_head });
        let segs = vocab.div_ceil(256);
        rec.row(Entry::Dequant, hr * segs, &[
            u(vocab), u(r.acc_head), u(r.s_head), s_lm, u(r.logits), u(segs),
        ]);
        rec.flush_audit();
    }
    Ok(())
}

/// A stage's Llama-family layers on the GPU of a [`GpuBackend`] (the device that runs the
/// stage's products), bit for bit the CPU's.
pub struct GpuLayers {
    backend: Arc<dyn Backend>,
    pipes: Pipes,
    work: Mutex<Work>,
    /// Rows of chunks a submission takes at most ([`GROUP_ROWS`]).
    group_rows: usize,
}

impl std::fmt::Debug for GpuLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLayers")
            .field("backend", &self.backend.name())
            .finish()
    }
}

fn model_err(what: &str, e: impl std::fmt::Display) -> daisy_model::Error {
    daisy_model::Error::Gemm {
        what: what.to_string(),
        reason: e.to_string(),
    }
}

impl GpuLayers {
    /// The layers of a stage whose products run on `backend`: `None` unless it is a
    /// [`GpuBackend`] whose device has 64-bit floats in shaders (the row kernels need them);
    /// [`Error::FloatGate`] where the device's float arithmetic fails the float library's gate
    /// (the layers must then stay on the CPU).
    pub fn new(backend: Arc<dyn Backend>) -> Result<Option<GpuLayers>> {
        GpuLayers::with_source(backend, LAYER_WGSL)
    }

    /// [`GpuLayers::new`] with another `layer.wgsl` (same bindings and entry points: tests build
    /// mutants this way).
    #[doc(hidden)]
    pub fn with_source(backend: Arc<dyn Backend>, layer_source: &str) -> Result<Option<GpuLayers>> {
        let Some(gpu_backend) = backend
            .as_any()
            .and_then(|a| a.downcast_ref::<GpuBackend>())
        else {
            return Ok(None);
        };
        let gpu = gpu_backend.gpu();
        if !gpu.f64 {
            return Ok(None);
        }
        gpu_backend.float_gate()?;
        let pipes = Pipes::new(gpu, gpu_backend.kernel_source(), layer_source)?;
        Ok(Some(GpuLayers {
            backend,
            pipes,
            work: Mutex::new(Work::default()),
            group_rows: GROUP_ROWS,
        }))
    }

    /// Sets the rows of chunks a submission takes at most (a longer chunk is one alone). Any value
    /// gives the same bits; this is for tests and benchmarks.
    pub fn set_group_rows(&mut self, rows: usize) {
        self.group_rows = rows.max(1);
    }

    /// The layer kernels' WGSL.
    pub fn layer_source() -> &'static str {
        LAYER_WGSL
    }

    fn gpu_backend(&self) -> &GpuBackend {
        match self
            .backend
            .as_any()
            .and_then(|a| a.downcast_ref::<GpuBackend>())
        {
            Some(b) => b,
            None => unreachable!("GpuLayers is only built over a GpuBackend"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run<'a>(
        &self,
        s: &LayerShape,
        layers: &[LlamaLayer<'a>],
        inv_freq: &[f32],
        x: &mut [f32],
        chunks: &[usize],
        pos0: usize,
        kv: &mut GpuKv,
        head: Option<&DeviceHead<'a>>,
    ) -> std::result::Result<Option<Vec<f32>>, daisy_model::Error> {
        let backend = self.gpu_backend();
        let gpu = backend.gpu();
        let dev = |e: Error| model_err("the GPU stage", e);
        let start = Instant::now();
        let (h, hd, heads, g) = (s.hidden, s.head_dim, s.heads, s.kv_heads);
        if heads == 0 || g == 0 || heads % g != 0 || hd % 2 != 0 || heads + g > 256 {
            return Err(daisy_model::Error::Invalid(format!(
                "{heads} heads over {g} kv heads of {hd}: the GPU stage needs whole groups, an even \
                 head size and at most 256 query and kv heads"
            )));
        }
        let half = hd / 2;
        let total: usize = chunks.iter().sum();
        let t = chunks.iter().copied().max().unwrap_or(0);
        let nk = pos0 + total;
        let nl = layers.len();
        kv.ensure(gpu, g, hd, nk).map_err(dev)?;
        let cap = kv.cap;
        let (kq_stride, kf_stride) = GpuKv::strides(g, hd, cap);
        if let Some(hd) = head
            && (hd.lm_head.k() != h || hd.norm.len() != h || hd.rows == 0 || hd.rows > total)
        {
            return Err(daisy_model::Error::Invalid(format!(
                "an lm_head of {}x{} and a norm of {} after {h}-wide rows, on {} of {total} rows",
                hd.lm_head.n(),
                hd.lm_head.k(),
                hd.norm.len(),
                hd.rows
            )));
        }
        let head_rows = head.map(|hd| (hd.rows, hd.lm_head.n()));
        let r = Regions::new(s, nl, t, nk, total, chunks.len(), head_rows);

        let mut guard = self.work.lock().unwrap_or_else(PoisonError::into_inner);
        let work = &mut *guard;
        use wgpu::BufferUsages as U;
        let store = U::STORAGE | U::COPY_DST | U::COPY_SRC;
        let mut changed = Buf::ensure(&mut work.fl, gpu, "stage floats", (r.fl * 4) as u64, store)
            .map_err(dev)?;
        changed |= Buf::ensure(
            &mut work.ops,
            gpu,
            "stage operands",
            (r.ops * 4) as u64,
            store,
        )
        .map_err(dev)?;
        changed |= Buf::ensure(
            &mut work.acc,
            gpu,
            "stage accumulators",
            (r.acc * 4) as u64,
            store,
        )
        .map_err(dev)?;
        Buf::ensure(
            &mut work.readback,
            gpu,
            "stage read-back",
            ((r.gtab - r.x) * 4) as u64,
            U::MAP_READ | U::COPY_DST,
        )
        .map_err(dev)?;
        if work
            .consts
            .as_ref()
            .is_none_or(|c| c.ids != Consts::ids(layers, head))
        {
            work.consts = Some(Consts::new(gpu, layers, head).map_err(dev)?);
        }

        // Record every layer.
        let mut seed = AUDIT_SEED.fetch_add(1, Ordering::Relaxed);
        let mut rec = Recorder {
            params: Vec::new(),
            cmds: Vec::new(),
            audits: Vec::new(),
            gather: Vec::new(),
            audit_words: 0,
            pending: 0,
            audit0: r.audit,
            gtab0: r.gtab,
            seed: splitmix(&mut seed),
            tuning: backend.tuning(),
            dispatches: (0, 0),
        };
        let (consts, head_consts) = match &work.consts {
            Some(c) => (&c.layers, c.head),
            None => unreachable!("placed just above"),
        };
        let at = Placement {
            head: head.zip(head_consts),
            r: &r,
            chunks,
            pos0,
            cap,
            kq_stride,
            kf_stride,
        };
        record(&mut rec, s, layers, consts, &at)?;

        // Uniforms, bind groups.
        changed |= Buf::ensure(
            &mut work.params,
            gpu,
            "stage parameters",
            rec.params.len() as u64,
            U::UNIFORM | U::COPY_DST,
        )
        .map_err(dev)?;
        if changed {
            work.weight_groups.clear();
            work.ops_group = None;
        }
        let (Some(fl), Some(ops), Some(acc), Some(params), Some(readback), Some(consts_buf)) = (
            &work.fl,
            &work.ops,
            &work.acc,
            &work.params,
            &work.readback,
            &work.consts,
        ) else {
            unreachable!("every buffer is ensured above")
        };
        let (Some(kq), Some(kf)) = (&kv.kq, &kv.kf) else {
            unreachable!("the cache is ensured above")
        };
        let uniform = |size| wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &params.buffer,
                offset: 0,
                size: std::num::NonZeroU64::new(size),
            }),
        };
        let gemm_group = |b: &wgpu::Buffer| {
            gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("stage gemm"),
                layout: Grid::layout(&self.pipes.gemm),
                entries: &[
                    uniform(DIMS_BYTES),
                    whole(1, &ops.buffer),
                    whole(2, b),
                    whole(3, &acc.buffer),
                ],
            })
        };
        let head_weights = head.map(|hd| hd.lm_head);
        for wts in layers
            .iter()
            .map(|l| vec![l.qkv, l.o, l.gate_up, l.down])
            .chain(head_weights.map(|w| vec![w]))
        {
            for wt in wts {
                if let std::collections::hash_map::Entry::Vacant(slot) =
                    work.weight_groups.entry(wt.id())
                {
                    let resident = backend.weights_for(wt).map_err(dev)?;
                    slot.insert(gemm_group(&resident.buffer));
                }
            }
        }
        if work.ops_group.is_none() {
            work.ops_group = Some(gemm_group(&ops.buffer));
        }
        let kv_group = gemm_group(kq);
        let row_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("stage rows"),
            layout: &self.pipes.layout,
            entries: &[
                uniform(L_BYTES),
                whole(1, &acc.buffer),
                whole(2, &consts_buf.buffer),
                whole(3, &fl.buffer),
                whole(4, &ops.buffer),
                whole(5, kq),
                whole(6, kf),
            ],
        });

        // Uploads: the rows, zero flags, RoPE's tables, the gather table, the parameters.
        let q = &gpu.queue;
        let wb = |at: usize| (at * 4) as u64;
        q.write_buffer(&fl.buffer, wb(r.x), bytemuck::cast_slice(x));
        q.write_buffer(
            &fl.buffer,
            wb(r.flags),
            bytemuck::cast_slice(&vec![0u32; nl.max(1)]),
        );
        // The pass's cos rows, then its sin rows.
        let mut tables = vec![0f32; 2 * total * half];
        let (cos, sin) = tables.split_at_mut(total * half);
        for (row, (c, s)) in cos
            .chunks_exact_mut(half)
            .zip(sin.chunks_exact_mut(half))
            .enumerate()
        {
            daisy_model::rope_cos_sin(pos0 + row, &inv_freq[..half], c, s);
        }
        // Each row's chunk; each chunk's first row, rows, first position and keys.
        let mut rtab = Vec::with_capacity(total);
        let mut ctab = Vec::with_capacity(4 * chunks.len());
        let mut off = 0;
        for (k, &rows) in chunks.iter().enumerate() {
            rtab.extend(std::iter::repeat_n(k as u32, rows));
            ctab.extend([off, rows, pos0 + off, pos0 + off + rows].map(|v| v as u32));
            off += rows;
        }
        q.write_buffer(&fl.buffer, wb(r.rtab), bytemuck::cast_slice(&rtab));
        q.write_buffer(&fl.buffer, wb(r.ctab), bytemuck::cast_slice(&ctab));
        q.write_buffer(&fl.buffer, wb(r.cos), bytemuck::cast_slice(&tables));
        let gtab: Vec<u32> = rec.gather.iter().flatten().copied().collect();
        if !gtab.is_empty() {
            q.write_buffer(&fl.buffer, wb(r.gtab), bytemuck::cast_slice(&gtab));
        }
        q.write_buffer(&params.buffer, 0, &rec.params);

        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("stage"),
            });
        // With GPU timestamps (a profile only): one before the first dispatch and one after each.
        let timer = gpu.timestamps.then(|| Timer::new(gpu, rec.cmds.len() + 1));
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("stage"),
                timestamp_writes: None,
            });
            if let Some(t) = &timer {
                t.write(&mut pass, 0);
            }
            for (i, cmd) in rec.cmds.iter().enumerate() {
                match cmd {
                    Cmd::Row {
                        entry,
                        slot,
                        groups,
                    } => {
                        pass.set_pipeline(&self.pipes.rows[entry]);
                        pass.set_bind_group(0, &row_group, &[*slot]);
                        pass.dispatch_workgroups(groups.0, groups.1, 1);
                    }
                    Cmd::Gemm {
                        group, slot, grid, ..
                    } => {
                        let bind = match group {
                            GemmGroup::Weights(id) => &work.weight_groups[id],
                            GemmGroup::Ops => match &work.ops_group {
                                Some(g) => g,
                                None => unreachable!("made above"),
                            },
                            GemmGroup::Kv => &kv_group,
                        };
                        pass.set_pipeline(grid.entry(&self.pipes.gemm));
                        pass.set_bind_group(0, bind, &[*slot]);
                        let (gx, gy, gz) = grid.groups;
                        pass.dispatch_workgroups(gx, gy, gz);
                    }
                }
                if let Some(t) = &timer {
                    t.write(&mut pass, i as u32 + 1);
                }
            }
        }
        if let Some(t) = &timer {
            t.resolve(&mut encoder);
        }
        let read_bytes = wb(r.audit + rec.audit_words - r.x);
        encoder.copy_buffer_to_buffer(&fl.buffer, wb(r.x), &readback.buffer, 0, read_bytes);
        let submission = q.submit([encoder.finish()]);
        let submitted = Instant::now();
        let slice = readback.buffer.slice(0..read_bytes);
        let mut logits: Option<Vec<f32>> = None;
        let (checked, done) = {
            let view = map_read(gpu, slice, submission).map_err(dev)?;
            let done = Instant::now();
            let words: &[u32] = bytemuck::cast_slice(&view);
            let rel = |at: usize| at - r.x;
            for (xv, wv) in x.iter_mut().zip(&words[rel(r.x)..rel(r.x) + total * h]) {
                *xv = f32::from_bits(*wv);
            }
            if let Some((hr, vocab)) = head_rows {
                logits = Some(
                    words[rel(r.logits)..rel(r.logits) + hr * vocab]
                        .iter()
                        .map(|w| f32::from_bits(*w))
                        .collect(),
                );
            }
            let flags = &words[rel(r.flags)..rel(r.flags) + nl];
            let audit = &words[rel(r.audit)..];
            (
                check(&self.backend.name(), layers, flags, audit, &rec.audits),
                done,
            )
        };
        readback.buffer.unmap();
        if let Some(t) = &timer {
            let ns = t.read(gpu).map_err(dev)?;
            backend.profile_kernels(rec.cmds.iter().map(Cmd::label).zip(ns));
        }
        checked?;
        kv.len = nk;
        backend.profile_add(
            rec.dispatches.0 + rec.dispatches.1,
            rec.dispatches.0,
            ((x.len() * 4) as u64, read_bytes),
            [
                submitted - start,
                submitted - start,
                done - submitted,
                done.elapsed(),
            ],
        );
        Ok(logits)
    }
}

/// GPU timestamps around a pass's dispatches (`DAISY_GPU_TIMESTAMPS=1`): where the GPU's time
/// goes, kernel by kernel. A query set holds at most `QUERIES` timestamps; a pass of more
/// dispatches takes several.
struct Timer {
    sets: Vec<wgpu::QuerySet>,
    resolved: wgpu::Buffer,
    read: wgpu::Buffer,
    count: u32,
}

const QUERIES: u32 = wgpu::QUERY_SET_MAX_QUERIES;

impl Timer {
    fn new(gpu: &Gpu, count: usize) -> Timer {
        let count = count as u32;
        let bytes = u64::from(count) * 8;
        let buf = |label, usage| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        use wgpu::BufferUsages as U;
        Timer {
            sets: (0..count.div_ceil(QUERIES))
                .map(|s| {
                    gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                        label: Some("stage timestamps"),
                        ty: wgpu::QueryType::Timestamp,
                        count: (count - s * QUERIES).min(QUERIES),
                    })
                })
                .collect(),
            resolved: buf("stage timestamps", U::QUERY_RESOLVE | U::COPY_SRC),
            read: buf("stage timestamps read-back", U::MAP_READ | U::COPY_DST),
            count,
        }
    }

    fn write(&self, pass: &mut wgpu::ComputePass<'_>, i: u32) {
        pass.write_timestamp(&self.sets[(i / QUERIES) as usize], i % QUERIES);
    }

    fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        for (s, set) in self.sets.iter().enumerate() {
            let first = s as u32 * QUERIES;
            let n = (self.count - first).min(QUERIES);
            encoder.resolve_query_set(set, 0..n, &self.resolved, u64::from(first) * 8);
        }
        encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.read, 0, u64::from(self.count) * 8);
    }

    /// Nanoseconds of each dispatch (the pass was submitted and waited for).
    fn read(&self, gpu: &Gpu) -> Result<Vec<u64>> {
        let slice = self.read.slice(..);
        let submission = gpu.queue.submit([]);
        let view = map_read(gpu, slice, submission)?;
        let ticks: &[u64] = bytemuck::cast_slice(&view);
        let period = f64::from(gpu.queue.get_timestamp_period());
        let ns = ticks
            .windows(2)
            .map(|w| (w[1].saturating_sub(w[0]) as f64 * period) as u64)
            .collect();
        drop(view);
        self.read.unmap();
        Ok(ns)
    }
}

/// The flags and audits a pass read back: the first layer that made a non-finite value, or the
/// first audited cell that differs from the scalar reference, refused by name.
fn check(
    backend: &str,
    layers: &[LlamaLayer<'_>],
    flags: &[u32],
    audit: &[u32],
    audits: &[Audit<'_>],
) -> std::result::Result<(), daisy_model::Error> {
    if let Some((layer, bits)) = layers.iter().zip(flags).find(|(_, f)| **f != 0) {
        return Err(daisy_model::Error::NonFinite {
            place: format!("layer {}", layer.index),
            value: f32::from_bits(*bits),
        });
    }
    let bytes: &[u8] = bytemuck::cast_slice(audit);
    let i8s =
        |at: usize, len: usize| -> &[i8] { bytemuck::cast_slice(&bytes[at * 4..at * 4 + len]) };
    let mut b_row = Vec::new();
    for a in audits {
        let rk = rw(a.k);
        let accs = a.at + 2 * rk;
        let [(s0, w0), (s1, w1)] = a.cols;
        let b0 = accs + 2 * (w0 + w1);
        // The accumulators were gathered row by row, block by block; B block by block.
        for (bi, (start, width)) in [(s0, w0), (s1, w1)].into_iter().enumerate() {
            let run0 = accs + if bi == 0 { 0 } else { w0 };
            let block0 = b0 + if bi == 0 { 0 } else { w0 * rk };
            for j in 0..width {
                let b = match a.b {
                    AuditB::Weights(wt) => {
                        b_row.resize(a.k, 0);
                        wt.write_row(start + j, &mut b_row);
                        &b_row[..]
                    }
                    AuditB::Rows => i8s(block0 + j * rk, a.k),
                };
                for (ri, &row) in a.rows.iter().enumerate() {
                    let expected = reference_cell(i8s(a.at + ri * rk, a.k), b);
                    let got = audit[run0 + ri * (w0 + w1) + j] as i32;
                    if got != expected {
                        return Err(model_err(
                            &a.what,
                            format!(
                                "audit of backend {backend} failed at row {row}, column {}: got {got}, expected {expected}",
                                start + j
                            ),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

impl DeviceLayers for GpuLayers {
    fn name(&self) -> String {
        self.backend.name()
    }

    fn forward(
        &self,
        shape: &LayerShape,
        layers: &[LlamaLayer<'_>],
        inv_freq: &[f32],
        x: &mut [f32],
        chunks: &[usize],
        pos0: usize,
        kv: Option<&mut dyn DeviceKv>,
        head: Option<&DeviceHead<'_>>,
    ) -> std::result::Result<Option<Vec<f32>>, daisy_model::Error> {
        let chunks: Vec<usize> = chunks.iter().copied().filter(|&c| c > 0).collect();
        let rows: usize = chunks.iter().sum();
        if rows == 0 || layers.is_empty() {
            return Ok(None);
        }
        if x.len() != rows * shape.hidden {
            return Err(daisy_model::Error::Activation {
                got: x.len() / rows,
                pos: pos0,
                expected: shape.hidden,
                want_pos: pos0,
            });
        }
        match kv {
            Some(kv) => {
                let Some(kv) = kv.as_any_mut().downcast_mut::<GpuKv>() else {
                    return Err(daisy_model::Error::Invalid(format!(
                        "a KV cache of another device for {}",
                        self.name()
                    )));
                };
                if kv.len != pos0 {
                    return Err(daisy_model::Error::Activation {
                        got: rows,
                        pos: pos0,
                        expected: rows,
                        want_pos: kv.len,
                    });
                }
                if kv.layers != layers.len() {
                    return Err(daisy_model::Error::Invalid(format!(
                        "cache of {} layers for a stage of {}",
                        kv.layers,
                        layers.len()
                    )));
                }
                // The chunks in groups of at most `group_rows` rows a submission (a group's row-wise
                // operands and attention's, chunk by chunk, are held at once); the head's rows are
                // the last group's.
                let (mut from, mut row, mut logits) = (0, 0, None);
                while from < chunks.len() {
                    let mut to = from + 1;
                    let mut rows = chunks[from];
                    // Attention's operands of a group are its chunks' rows a head times the
                    // group's last key: bounded too.
                    let attention = |chunks: usize, tmax: usize, rows: usize| {
                        chunks * shape.heads * tmax * (pos0 + row + rows)
                    };
                    let mut tmax = chunks[from];
                    while to < chunks.len()
                        && rows + chunks[to] <= self.group_rows
                        && attention(to + 1 - from, tmax.max(chunks[to]), rows + chunks[to])
                            <= GROUP_ATTENTION_WORDS
                    {
                        rows += chunks[to];
                        tmax = tmax.max(chunks[to]);
                        to += 1;
                    }
                    let xs = &mut x[row * shape.hidden..(row + rows) * shape.hidden];
                    let group_head = head.filter(|_| to == chunks.len()).map(|hd| DeviceHead {
                        rows: hd.rows.min(rows),
                        ..*hd
                    });
                    logits = self.run(
                        shape,
                        layers,
                        inv_freq,
                        xs,
                        &chunks[from..to],
                        pos0 + row,
                        kv,
                        group_head.as_ref(),
                    )?;
                    (from, row) = (to, row + rows);
                }
                Ok(logits)
            }
            None => {
                if pos0 != 0 || chunks.len() != 1 {
                    return Err(daisy_model::Error::Invalid(format!(
                        "full-window attention is one pass from position 0, got {} from {pos0}",
                        chunks.len()
                    )));
                }
                let mut local = GpuKv::new(layers.len());
                self.run(shape, layers, inv_freq, x, &chunks, 0, &mut local, head)
            }
        }
    }

    fn new_kv(&self, layers: usize) -> Box<dyn DeviceKv> {
        Box::new(GpuKv::new(layers))
    }
}
