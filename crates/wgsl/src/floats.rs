//! DESIGN §3.8's float operations on the GPU, bit for bit (`floats.wgsl`), and probes of what an
//! adapter's own float arithmetic does (fused multiply-adds, flushed subnormals, the precision of
//! its division and square root).
//!
//! This is the first piece of a stage whose work between the integer products stays on the device:
//! the contract allows it only where every value is the CPU's to the bit. `FloatLab` runs one
//! elementwise entry point over bit-typed buffers; the tests hold the contract's operations to the
//! CPU's bits on every adapter they run on and print the probes.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::device::Gpu;
use crate::error::{Error, FloatMismatch, Result};

/// The WGSL library (the `EXP_*` constants are prepended by [`library_source`]).
pub const FLOATS_WGSL: &str = include_str!("floats.wgsl");
/// `FloatLab`'s bindings and entry points over the library.
const LAB_WGSL: &str = include_str!("lab.wgsl");

/// Threads per workgroup of every entry point (`@workgroup_size` in `floats.wgsl`).
const GROUP: usize = 256;
/// The most workgroups of one dispatch dimension.
const MAX_GROUPS: usize = 65535;

/// The contract's `e^x` constants (`crates/model/src/exp.rs`) as WGSL `const`s, so the shader
/// evaluates the same polynomial from the same f64 values.
fn exp_constants() -> String {
    let factorials: [f64; 12] = [
        6_227_020_800.0,
        479_001_600.0,
        39_916_800.0,
        3_628_800.0,
        362_880.0,
        40_320.0,
        5_040.0,
        720.0,
        120.0,
        24.0,
        6.0,
        2.0,
    ];
    let mut out = String::new();
    let mut c = |name: &str, v: f64| out.push_str(&format!("const {name}: f64 = {v:e}lf;\n"));
    c("EXP_LO", -104.0);
    c("EXP_HI", 89.0);
    c("EXP_LOG2E", std::f64::consts::LOG2_E);
    c("EXP_LN2_HI", f64::from_bits(0x3fe6_2e42_fee0_0000));
    c("EXP_LN2_LO", f64::from_bits(0x3dea_39ef_3579_3c76));
    for (i, f) in factorials.iter().enumerate() {
        c(&format!("EXP_C{}", 13 - i), 1.0 / f);
    }
    out
}

/// The library with its constants: what every module of float work starts with.
pub(crate) fn library_source() -> String {
    format!("{}\n{FLOATS_WGSL}", exp_constants())
}

/// `FloatLab`'s module over `body` (the library, or a test's mutant of it).
fn source(body: &str) -> String {
    format!("{}\n{body}\n{LAB_WGSL}", exp_constants())
}

/// An open device with `SHADER_F64` and the float library's pipelines (built on first use).
pub struct FloatLab {
    gpu: Gpu,
    module: wgpu::ShaderModule,
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    pipelines: Mutex<HashMap<String, wgpu::ComputePipeline>>,
}

fn whole(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}

fn entry(binding: u32, ty: wgpu::BufferBindingType) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

impl FloatLab {
    /// Opens the environment's adapter; refuses one without 64-bit floats in shaders.
    pub fn open() -> Result<FloatLab> {
        FloatLab::with_source(FLOATS_WGSL)
    }

    /// [`FloatLab::open`] with another library body (same bindings and entry points).
    pub fn with_source(body: &str) -> Result<FloatLab> {
        FloatLab::on(Gpu::open()?, body)
    }

    /// The lab on an open device.
    pub(crate) fn on(gpu: Gpu, body: &str) -> Result<FloatLab> {
        if !gpu.f64 {
            return Err(Error::MissingFeature {
                adapter: gpu.adapter_name(),
                feature: "SHADER_F64 (64-bit floats in shaders)",
            });
        }
        let device = &gpu.device;
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("floats"),
            source: wgpu::ShaderSource::Wgsl(source(body).into()),
        });
        use wgpu::BufferBindingType as T;
        let storage = |read_only| T::Storage { read_only };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("floats"),
            entries: &[
                entry(0, T::Uniform),
                entry(1, storage(true)),
                entry(2, storage(true)),
                entry(3, storage(true)),
                entry(4, storage(false)),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("floats"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        gpu.take_error()?;
        Ok(FloatLab {
            gpu,
            module,
            layout,
            pipeline_layout,
            pipelines: Mutex::new(HashMap::new()),
        })
    }

    /// The adapter's name, backend and driver.
    pub fn adapter_name(&self) -> String {
        self.gpu.adapter_name()
    }

    fn pipeline(&self, name: &str) -> Result<wgpu::ComputePipeline> {
        let mut pipelines = self
            .pipelines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(p) = pipelines.get(name) {
            return Ok(p.clone());
        }
        let p = self
            .gpu
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: Some(&self.pipeline_layout),
                module: &self.module,
                entry_point: Some(name),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            });
        self.gpu.take_error()?;
        pipelines.insert(name.to_owned(), p.clone());
        Ok(p)
    }

    /// Runs entry point `name` over `n` lanes with the inputs as words (f32 bits, or f64 as two
    /// words, low first; an empty input binds a placeholder); returns one word per lane.
    pub fn run(&self, name: &str, n: usize, inputs: [&[u32]; 3]) -> Result<Vec<u32>> {
        self.run_wide(name, n, 1, inputs)
    }

    /// [`FloatLab::run`] for entry points that write `per_lane` words a lane (2 for an f64).
    pub fn run_wide(
        &self,
        name: &str,
        n: usize,
        per_lane: usize,
        inputs: [&[u32]; 3],
    ) -> Result<Vec<u32>> {
        let groups = n.div_ceil(GROUP);
        let grid = if groups <= MAX_GROUPS {
            (groups, 1)
        } else {
            (MAX_GROUPS, groups.div_ceil(MAX_GROUPS))
        };
        self.launch(name, n, grid, n * per_lane, &[], inputs)
    }

    /// Runs row entry point `name` with one workgroup a row, `dims` as its `d0..` (at most six),
    /// and returns its `out_words` output words.
    pub fn run_rows(
        &self,
        name: &str,
        rows: usize,
        out_words: usize,
        dims: &[u32],
        inputs: [&[u32]; 3],
    ) -> Result<Vec<u32>> {
        if rows > MAX_GROUPS {
            return Err(Error::TooLarge {
                what: "rows of a row entry point",
                bytes: rows as u64,
                limit: MAX_GROUPS as u64,
            });
        }
        self.launch(name, rows, (rows, 1), out_words, dims, inputs)
    }

    /// The float library's gate (DESIGN §3.7's idea applied to the steps between the products):
    /// before a stage's layers go onto a device, a few thousand lanes of each operation the layer
    /// kernels rest on run there against the CPU's bits: the contract's exponential over the
    /// softmax's and SiLU's ranges, the row quantization on ties of both parities (a driver's own
    /// `round` may take ties its own way: Mesa 22.3's lavapipe does on a host without AVX-512),
    /// f32 products and sums each rounded alone with subnormals (a driver may fuse or flush), the
    /// f32 quotient and RMSNorm's scale. The first lane that differs is the error.
    pub fn gate(&self) -> Result<()> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut unit = move || (daisy_gemm_int8::splitmix(&mut state) >> 40) as f32 / 16_777_216.0;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        let differs = |operation: &'static str,
                       got: Vec<u32>,
                       want: &[u32],
                       input: &dyn Fn(usize) -> String|
         -> Result<()> {
            match got.iter().zip(want).position(|(g, w)| g != w) {
                None => Ok(()),
                Some(i) => Err(Error::FloatGate(FloatMismatch {
                    adapter: self.gpu.adapter_name(),
                    operation,
                    input: input(i),
                    got: got[i],
                    expected: want[i],
                })),
            }
        };

        // e^x: the softmax's arguments (subnormal results below -87.3), SiLU's, and the edges.
        let mut xs: Vec<f32> = vec![
            0.0, -0.0, -87.34, -103.97, -104.5, 88.72, 88.73, -1e30, 1e30,
        ];
        for _ in 0..2048 {
            let u = unit();
            xs.extend([-110.0 * u, 40.0 * u - 20.0]);
        }
        let want: Vec<u32> = xs.iter().map(|&x| daisy_model::exp(x).to_bits()).collect();
        let got = self.run("exp_f32", xs.len(), [&bits(&xs), &[], &[]])?;
        differs("exp", got, &want, &|i| format!("{:e}", xs[i]))?;

        // The quantization of one value against its row's max: every tie k + 0.5, then random
        // values.
        let (vs, invs, want) = quantization_lanes(&[0.75, 3.3, 1234.5], 256, &mut unit);
        let got = self.run("quantize_f32", vs.len(), [&bits(&vs), &invs, &[]])?;
        differs("quantization", got, &want, &|i| {
            format!("{:e} at 127/max = {:e}", vs[i], f32::from_bits(invs[i]))
        })?;

        // f32 a * b + c, each rounded alone: products near and below the subnormal range, and
        // addends that cancel the product down to its last bits (a fused multiply-add differs).
        let (mut a, mut b, mut c) = (vec![], vec![], vec![]);
        for i in 0..2048 {
            let x = (unit() + 0.5) * 2f32.powi(-60 - (i % 12));
            let y = (unit() + 0.5) * 2f32.powi(-60 - (i % 9));
            let cancel = if i % 2 == 0 {
                -(x * y) * (1.0 + unit() * 1e-6)
            } else {
                unit() * 1e-36
            };
            a.push(x);
            b.push(y);
            c.push(cancel);
            let (x, y) = (unit() * 8.0 - 4.0, unit() * 8.0 - 4.0);
            a.push(x);
            b.push(y);
            c.push(-(x * y) * (1.0 + (unit() - 0.5) * 1e-5));
        }
        let want: Vec<u32> = (0..a.len())
            .map(|i| (a[i] * b[i] + c[i]).to_bits())
            .collect();
        let got = self.run("mul_add_f32", a.len(), [&bits(&a), &bits(&b), &bits(&c)])?;
        differs("f32 a * b + c", got, &want, &|i| {
            format!("{:e} * {:e} + {:e}", a[i], b[i], c[i])
        })?;

        // The f32 quotient (short divisors make exact quotients and ties) and RMSNorm's row scale.
        let x: Vec<f32> = (0..2048).map(|_| (unit() - 0.5) * 1e4).collect();
        let y: Vec<f32> = (0..2048)
            .map(|i| match i % 3 {
                0 => (unit() * 300.0).round().max(1.0),
                _ => (unit() + 0.01) * 50.0,
            })
            .collect();
        let want: Vec<u32> = x.iter().zip(&y).map(|(p, q)| (p / q).to_bits()).collect();
        let got = self.run("div_f32", x.len(), [&bits(&x), &bits(&y), &[]])?;
        differs("f32 a / b", got, &want, &|i| {
            format!("{:e} / {:e}", x[i], y[i])
        })?;
        let ms: Vec<f64> = (0..2048)
            .map(|_| f64::from(unit()) * 2f64.powi(-20) * 4e6)
            .collect();
        let eps: Vec<f32> = (0..ms.len()).map(|i| [1e-5, 1e-6, 1e-12][i % 3]).collect();
        let want: Vec<u32> = ms
            .iter()
            .zip(&eps)
            .map(|(m, e)| ((1.0 / (m + f64::from(*e)).sqrt()) as f32).to_bits())
            .collect();
        let got = self.run("inv_rms", ms.len(), [&f64_words(&ms), &bits(&eps), &[]])?;
        differs("RMSNorm's 1 / sqrt(ms + eps)", got, &want, &|i| {
            format!("ms = {:e}, eps = {:e}", ms[i], eps[i])
        })
    }

    fn launch(
        &self,
        name: &str,
        n: usize,
        (x, y): (usize, usize),
        out_words: usize,
        dims: &[u32],
        inputs: [&[u32]; 3],
    ) -> Result<Vec<u32>> {
        if dims.len() > 6 {
            return Err(Error::ShapeMismatch {
                operand: "the row entry point's dims",
                got: dims.len(),
                expected: 6,
            });
        }
        if n == 0 || out_words == 0 {
            return Ok(Vec::new());
        }
        let pipeline = self.pipeline(name)?;
        let device = &self.gpu.device;
        use wgpu::util::DeviceExt;
        let mut params = [0u32; 8];
        params[0] = n as u32;
        params[1] = 1.0f32.to_bits();
        for (p, d) in params[2..].iter_mut().zip(dims) {
            *p = *d;
        }
        let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("floats params"),
            contents: bytemuck::cast_slice(&params),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let placeholder = [0u32; 4];
        let storage: Vec<wgpu::Buffer> = inputs
            .iter()
            .map(|words| {
                let words = if words.is_empty() {
                    &placeholder
                } else {
                    *words
                };
                device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("floats input"),
                    contents: bytemuck::cast_slice(words),
                    usage: wgpu::BufferUsages::STORAGE,
                })
            })
            .collect();
        let bytes = (out_words * 4) as u64;
        let out = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("floats out"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("floats readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("floats"),
            layout: &self.layout,
            entries: &[
                whole(0, &uniform),
                whole(1, &storage[0]),
                whole(2, &storage[1]),
                whole(3, &storage[2]),
                whole(4, &out),
            ],
        });
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("floats"),
        });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(name),
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &group, &[]);
            pass.dispatch_workgroups(x as u32, y as u32, 1);
        }
        encoder.copy_buffer_to_buffer(&out, 0, &readback, 0, bytes);
        let submission = self.gpu.queue.submit([encoder.finish()]);
        let words = {
            let view = crate::kernel::map_read(&self.gpu, readback.slice(..), submission)?;
            bytemuck::cast_slice::<u8, u32>(&view).to_vec()
        };
        readback.unmap();
        Ok(words)
    }
}

/// Lanes of `quantize_f32` with the CPU's answer: for each row max in `maxes`, the values the
/// row quantization takes to a tie (whose f32 product with the contract's `127 / max` is exactly
/// k + 0.5, for every k in -127..=126 where an f32 near the quotient has it: a driver's own rounding
/// to an integer may take a tie either way), then `random` values of the row (`unit` draws in
/// [0, 1)). Returns the values, each lane's `127 / max` as bits, and the int8 that
/// `daisy_gemm_int8::quantize_rows` gives the value in the row `[max, v]`, as i32 bits.
pub fn quantization_lanes(
    maxes: &[f32],
    random: usize,
    unit: &mut dyn FnMut() -> f32,
) -> (Vec<f32>, Vec<u32>, Vec<u32>) {
    let (mut vs, mut invs, mut want) = (vec![], vec![], vec![]);
    for &max in maxes {
        let inv = 127f32 / max;
        let mut push = |v: f32| {
            if let Ok(q) = daisy_gemm_int8::quantize_rows(&[max, v], 1, 2) {
                vs.push(v);
                invs.push(inv.to_bits());
                want.push(i32::from(q.q()[1]) as u32);
            }
        };
        for k in -127..=126 {
            let tie = k as f32 + 0.5;
            let guess = tie / inv;
            for d in -8i32..=8 {
                let v = f32::from_bits(guess.to_bits().wrapping_add_signed(d));
                if v * inv == tie && v.abs() <= max {
                    push(v);
                }
            }
        }
        for _ in 0..random {
            push(max * (2.0 * unit() - 1.0));
        }
    }
    (vs, invs, want)
}

/// [`FloatLab::gate`] of the library on `gpu`.
pub(crate) fn gate(gpu: &Gpu) -> Result<()> {
    FloatLab::on(gpu.clone(), FLOATS_WGSL)?.gate()
}

/// f64 values as the words `FloatLab::run` takes (two a value, low first).
pub fn f64_words(values: &[f64]) -> Vec<u32> {
    values
        .iter()
        .flat_map(|v| {
            let b = v.to_bits();
            [b as u32, (b >> 32) as u32]
        })
        .collect()
}
