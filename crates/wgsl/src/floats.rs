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
use crate::error::{Error, Result};

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
        let gpu = Gpu::open()?;
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
