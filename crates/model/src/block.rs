//! One transformer layer of either family, loaded from the checkpoint's own tensor names.
//!
//! Llama follows `transformers`' `modeling_llama.py` (and `modeling_qwen2.py` / `modeling_mistral.py`
//! for the QKV bias and sliding windows); GPT-2 follows `modeling_gpt2.py`. Both differ from the
//! reference in one way: Q, K and V (and Llama's gate and up) are one fused product. A product's cells
//! depend only on their own input row and weight row (f32 dot, or int8 with one scale per activation
//! row and one per weight row), so fusing changes no bit.

use crate::attention::{Heads, LayerCache, attention};
use crate::device::{DeviceKv, LlamaLayer};
use crate::gemm::{Ctx, Linear, Precision};
use crate::ops::{
    Rope, add_rows, first_non_finite, gelu_new, layer_norm, rms_norm, rotate, silu, silu_mul_rows,
};
use crate::shard::{Put, Take};
use crate::source::{Source, read_shaped};
use crate::{Error, Result};
use daisy_gemm_int8::recycle_output;
use daisy_loader::{Arch, HiddenAct, ModelConfig};

pub(crate) enum Block {
    Llama(LlamaBlock),
    Gpt2(Gpt2Block),
}

pub(crate) struct LlamaBlock {
    index: usize,
    input_norm: Vec<f32>,
    qkv: Linear,
    o: Linear,
    post_norm: Vec<f32>,
    gate_up: Linear,
    down: Linear,
}

pub(crate) struct Gpt2Block {
    index: usize,
    ln1: (Vec<f32>, Vec<f32>),
    c_attn: Linear,
    c_proj: Linear,
    ln2: (Vec<f32>, Vec<f32>),
    fc: Linear,
    proj: Linear,
}

/// Transpose a `rows×cols` matrix (GPT-2's Conv1D stores `[in, out]`).
fn transpose(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = w[r * cols + c];
        }
    }
    out
}

/// Called on each product's weights as soon as they are made, before the next are read (the
/// stage moves them into its arena there, so a layer's earlier products are not held twice while
/// its later ones load).
pub(crate) type Made<'a> = &'a mut dyn FnMut(&mut Linear) -> Result<()>;

impl Block {
    pub(crate) fn load(
        src: &dyn Source,
        cfg: &ModelConfig,
        i: usize,
        precision: Precision,
        made: Made<'_>,
    ) -> Result<Self> {
        match cfg.arch {
            Arch::Llama => LlamaBlock::load(src, cfg, i, precision, made).map(Block::Llama),
            Arch::Gpt2 => Gpt2Block::load(src, cfg, i, precision, made).map(Block::Gpt2),
        }
    }

    /// The block's products' weights.
    pub(crate) fn linears(&self) -> [&Linear; 4] {
        match self {
            Block::Llama(b) => [&b.qkv, &b.o, &b.gate_up, &b.down],
            Block::Gpt2(b) => [&b.c_attn, &b.c_proj, &b.fc, &b.proj],
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            Block::Llama(b) => {
                (b.input_norm.len() + b.post_norm.len()) * 4
                    + b.qkv.bytes()
                    + b.o.bytes()
                    + b.gate_up.bytes()
                    + b.down.bytes()
            }
            Block::Gpt2(b) => {
                (b.ln1.0.len() * 4) * 4
                    + b.c_attn.bytes()
                    + b.c_proj.bytes()
                    + b.fc.bytes()
                    + b.proj.bytes()
            }
        }
    }

    /// The layer as held, for a shard.
    pub(crate) fn write(&self, put: &mut Put<'_>) {
        match self {
            Block::Llama(b) => {
                put.u8(0);
                put.u64(b.index as u64);
                put.f32s(&b.input_norm);
                b.qkv.write(put);
                b.o.write(put);
                put.f32s(&b.post_norm);
                b.gate_up.write(put);
                b.down.write(put);
            }
            Block::Gpt2(b) => {
                put.u8(1);
                put.u64(b.index as u64);
                put.f32s(&b.ln1.0);
                put.f32s(&b.ln1.1);
                b.c_attn.write(put);
                b.c_proj.write(put);
                put.f32s(&b.ln2.0);
                put.f32s(&b.ln2.1);
                b.fc.write(put);
                b.proj.write(put);
            }
        }
    }

    /// What [`Block::write`] wrote, checked against the model's shapes.
    pub(crate) fn read(
        cfg: &ModelConfig,
        precision: Precision,
        take: &mut Take<'_>,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let inter = cfg.intermediate_size;
        let norm = |take: &mut Take<'_>| -> Result<Vec<f32>> {
            let v = take.f32s()?;
            if v.len() != h {
                return Err(Error::Invalid(format!(
                    "a shard's norm of {} values, the model's hidden size is {h}",
                    v.len()
                )));
            }
            Ok(v)
        };
        let block = match (take.u8()?, cfg.arch) {
            (0, Arch::Llama) => {
                let index = take.u64()? as usize;
                let qd = cfg.num_heads * cfg.head_dim;
                let kvd = cfg.num_kv_heads * cfg.head_dim;
                Block::Llama(LlamaBlock {
                    index,
                    input_norm: norm(take)?,
                    qkv: Linear::read(take, precision, qd + 2 * kvd, h)?,
                    o: Linear::read(take, precision, h, qd)?,
                    post_norm: norm(take)?,
                    gate_up: Linear::read(take, precision, 2 * inter, h)?,
                    down: Linear::read(take, precision, h, inter)?,
                })
            }
            (1, Arch::Gpt2) => {
                let index = take.u64()? as usize;
                Block::Gpt2(Gpt2Block {
                    index,
                    ln1: (norm(take)?, norm(take)?),
                    c_attn: Linear::read(take, precision, 3 * h, h)?,
                    c_proj: Linear::read(take, precision, h, h)?,
                    ln2: (norm(take)?, norm(take)?),
                    fc: Linear::read(take, precision, inter, h)?,
                    proj: Linear::read(take, precision, h, inter)?,
                })
            }
            (tag, arch) => {
                return Err(Error::Invalid(format!(
                    "a shard's layer of family {tag}, the model is {arch:?}"
                )));
            }
        };
        take.done()?;
        Ok(block)
    }

    /// The layer as a device runs it: Llama-family at int8 only.
    pub(crate) fn llama(&self, cfg: &ModelConfig) -> Option<LlamaLayer<'_>> {
        let Block::Llama(b) = self else {
            return None;
        };
        Some(LlamaLayer {
            index: b.index,
            input_norm: &b.input_norm,
            qkv: b.qkv.int8()?,
            qkv_bias: b.qkv.bias(),
            o: b.o.int8()?,
            post_norm: &b.post_norm,
            gate_up: b.gate_up.int8()?,
            down: b.down.int8()?,
            window: cfg.sliding_window[b.index],
        })
    }

    /// The layer's index in the model.
    pub(crate) fn index(&self) -> usize {
        match self {
            Block::Llama(b) => b.index,
            Block::Gpt2(b) => b.index,
        }
    }

    /// Run the layer over `t` rows at positions `pos0..`, in place.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        cfg: &ModelConfig,
        cx: Ctx<'_>,
        rope: &Rope<'_>,
        x: &mut [f32],
        t: usize,
        pos0: usize,
        cache: Option<&mut LayerCache>,
    ) -> Result<()> {
        let index = match self {
            Block::Llama(b) => {
                b.forward(cfg, cx, rope, x, t, pos0, cache)?;
                b.index
            }
            Block::Gpt2(b) => {
                b.forward(cfg, cx, x, t, pos0, cache)?;
                b.index
            }
        };
        if let Some(value) = first_non_finite(x) {
            return Err(Error::NonFinite {
                place: format!("layer {index}"),
                value,
            });
        }
        Ok(())
    }
}

fn act_fn(a: HiddenAct) -> fn(f32) -> f32 {
    match a {
        HiddenAct::GeluNew => gelu_new,
        HiddenAct::Silu => silu,
    }
}

fn heads(cfg: &ModelConfig, i: usize) -> Heads {
    Heads {
        num_heads: cfg.num_heads,
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        window: cfg.sliding_window[i],
    }
}

impl LlamaBlock {
    fn load(
        src: &dyn Source,
        cfg: &ModelConfig,
        i: usize,
        precision: Precision,
        made: Made<'_>,
    ) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let h = cfg.hidden_size;
        let qd = cfg.num_heads * cfg.head_dim;
        let kvd = cfg.num_kv_heads * cfg.head_dim;
        let inter = cfg.intermediate_size;
        let input_norm = read_shaped(src, &format!("{p}.input_layernorm.weight"), &[h])?;
        // Each weight read a block of rows at a time, quantized as it comes (`Linear::stacked`).
        let part = |name: &str, rows: usize| (format!("{p}.{name}.weight"), rows);
        let qkv_parts = [
            part("self_attn.q_proj", qd),
            part("self_attn.k_proj", kvd),
            part("self_attn.v_proj", kvd),
        ];
        let bias = if cfg.qkv_bias {
            let mut b = read_shaped(src, &format!("{p}.self_attn.q_proj.bias"), &[qd])?;
            b.extend(read_shaped(
                src,
                &format!("{p}.self_attn.k_proj.bias"),
                &[kvd],
            )?);
            b.extend(read_shaped(
                src,
                &format!("{p}.self_attn.v_proj.bias"),
                &[kvd],
            )?);
            Some(b)
        } else {
            None
        };
        let mut qkv = Linear::stacked(precision, src, &qkv_parts, h, bias)?;
        made(&mut qkv)?;
        let mut o = Linear::stacked(precision, src, &[part("self_attn.o_proj", h)], qd, None)?;
        made(&mut o)?;
        let post_norm = read_shaped(src, &format!("{p}.post_attention_layernorm.weight"), &[h])?;
        let gate_up_parts = [part("mlp.gate_proj", inter), part("mlp.up_proj", inter)];
        let mut gate_up = Linear::stacked(precision, src, &gate_up_parts, h, None)?;
        made(&mut gate_up)?;
        let mut down = Linear::stacked(precision, src, &[part("mlp.down_proj", h)], inter, None)?;
        made(&mut down)?;
        Ok(Self {
            index: i,
            input_norm,
            qkv,
            o,
            post_norm,
            gate_up,
            down,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        cfg: &ModelConfig,
        cx: Ctx<'_>,
        rope: &Rope<'_>,
        x: &mut [f32],
        t: usize,
        pos0: usize,
        cache: Option<&mut LayerCache>,
    ) -> Result<()> {
        let i = self.index;
        let h = cfg.hidden_size;
        let qd = cfg.num_heads * cfg.head_dim;
        let kvd = cfg.num_kv_heads * cfg.head_dim;
        let mut hs = daisy_gemm_int8::output_buffer(x.len());
        hs.copy_from_slice(x);
        rms_norm(&mut hs, h, &self.input_norm, cfg.norm_eps);
        let mut qkv = self
            .qkv
            .forward(cx, &hs, t, &|| format!("layer {i} q/k/v projection"))?;
        // At decode the products are memory-bound and attention is not: the GEMM's idle worker
        // brings the next weights towards the caches meanwhile.
        let ahead = t == 1;
        if ahead {
            self.o.prefetch();
            self.gate_up.prefetch();
        }
        // The query heads and the key heads lie side by side at the start of each row.
        rotate(&mut qkv, qd + 2 * kvd, qd + kvd, rope);
        let attn = attention(cx, &heads(cfg, i), &qkv, t, pos0, cache, i)?;
        recycle_output(qkv);
        let o = self.o.forward(cx, &attn, t, &|| {
            format!("layer {i} attention output projection")
        })?;
        recycle_output(attn);
        add_rows(x, &o, h);
        recycle_output(o);
        if ahead {
            self.gate_up.prefetch();
        }
        hs.copy_from_slice(x);
        rms_norm(&mut hs, h, &self.post_norm, cfg.norm_eps);
        let gu = self
            .gate_up
            .forward(cx, &hs, t, &|| format!("layer {i} gate/up projection"))?;
        if ahead {
            self.down.prefetch();
        }
        let inter = cfg.intermediate_size;
        let act = if cfg.hidden_act == HiddenAct::Silu {
            silu_mul_rows(&gu, inter)
        } else {
            let f = act_fn(cfg.hidden_act);
            let mut act = Vec::with_capacity(t * inter);
            for row in gu.chunks_exact(2 * inter) {
                let (g, u) = row.split_at(inter);
                act.extend(g.iter().zip(u).map(|(g, u)| f(*g) * u));
            }
            act
        };
        recycle_output(gu);
        let d = self
            .down
            .forward(cx, &act, t, &|| format!("layer {i} down projection"))?;
        recycle_output(act);
        add_rows(x, &d, h);
        recycle_output(d);
        recycle_output(hs);
        Ok(())
    }
}

impl Gpt2Block {
    fn load(
        src: &dyn Source,
        cfg: &ModelConfig,
        i: usize,
        precision: Precision,
        made: Made<'_>,
    ) -> Result<Self> {
        let p = format!("h.{i}");
        let h = cfg.hidden_size;
        let inter = cfg.intermediate_size;
        let norm = |name: &str| -> Result<(Vec<f32>, Vec<f32>)> {
            Ok((
                read_shaped(src, &format!("{p}.{name}.weight"), &[h])?,
                read_shaped(src, &format!("{p}.{name}.bias"), &[h])?,
            ))
        };
        let mut conv = |name: &str, inp: usize, out: usize| -> Result<Linear> {
            let w = read_shaped(src, &format!("{p}.{name}.weight"), &[inp, out])?;
            let b = read_shaped(src, &format!("{p}.{name}.bias"), &[out])?;
            let mut l = Linear::new(precision, transpose(&w, inp, out), out, inp, Some(b))?;
            made(&mut l)?;
            Ok(l)
        };
        Ok(Self {
            index: i,
            ln1: norm("ln_1")?,
            c_attn: conv("attn.c_attn", h, 3 * h)?,
            c_proj: conv("attn.c_proj", h, h)?,
            ln2: norm("ln_2")?,
            fc: conv("mlp.c_fc", h, inter)?,
            proj: conv("mlp.c_proj", inter, h)?,
        })
    }

    fn forward(
        &self,
        cfg: &ModelConfig,
        cx: Ctx<'_>,
        x: &mut [f32],
        t: usize,
        pos0: usize,
        cache: Option<&mut LayerCache>,
    ) -> Result<()> {
        let i = self.index;
        let h = cfg.hidden_size;
        let mut hs = x.to_vec();
        layer_norm(&mut hs, h, &self.ln1.0, &self.ln1.1, cfg.norm_eps);
        let qkv = self
            .c_attn
            .forward(cx, &hs, t, &|| format!("layer {i} c_attn"))?;
        let attn = attention(cx, &heads(cfg, i), &qkv, t, pos0, cache, i)?;
        let o = self
            .c_proj
            .forward(cx, &attn, t, &|| format!("layer {i} attention c_proj"))?;
        for (xv, ov) in x.iter_mut().zip(&o) {
            *xv += ov;
        }
        hs.copy_from_slice(x);
        layer_norm(&mut hs, h, &self.ln2.0, &self.ln2.1, cfg.norm_eps);
        let mut f = self.fc.forward(cx, &hs, t, &|| format!("layer {i} c_fc"))?;
        let act = act_fn(cfg.hidden_act);
        for v in f.iter_mut() {
            *v = act(*v);
        }
        let d = self
            .proj
            .forward(cx, &f, t, &|| format!("layer {i} mlp c_proj"))?;
        for (xv, dv) in x.iter_mut().zip(&d) {
            *xv += dv;
        }
        Ok(())
    }
}

/// The per-layer caches of one stage, for the cached path: in host memory, or in the memory of
/// the device that runs the stage's layers.
#[derive(Debug, Default)]
pub struct StageCache {
    pub(crate) layers: Vec<LayerCache>,
    pub(crate) device: Option<Box<dyn DeviceKv>>,
}

impl StageCache {
    /// Positions held (every layer holds the same).
    pub fn len(&self) -> usize {
        match &self.device {
            Some(d) => d.len(),
            None => self.layers.first().map_or(0, LayerCache::len),
        }
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keep the first `len` positions of every layer; the rows of a GEMM's keys and values are
    /// independent, so what is kept is exactly what those positions' passes wrote.
    pub fn truncate(&mut self, len: usize) {
        if let Some(d) = &mut self.device {
            d.truncate(len);
        }
        for l in &mut self.layers {
            l.truncate(len);
        }
    }
}
