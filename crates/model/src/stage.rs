//! A `Stage`: layers `[a, b)` of one model; the head stage also owns the embedding, the final norm
//! and the lm_head (tied or not). A stage loads and holds only the tensors it owns.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use daisy_gemm_int8::{Backend, CpuBackend};

use crate::attention::LayerCache;
use crate::block::{Block, StageCache};
use crate::device::{DeviceHead, DeviceKv, DeviceLayers, LayerShape, LlamaLayer};
use crate::gemm::{Ctx, Linear, Precision};
use crate::ops::{Rope, first_non_finite, layer_norm, rms_norm, rope_inv_freq};
use crate::shard::{Shard, ShardKey, ShardWriter, Streamed};
use crate::source::{Embedding, Source, read_shaped};
use crate::{Error, Result};
use daisy_loader::{Arch, ModelConfig};

/// The parts only the head holds.
struct Head {
    embed: Embedding,
    /// GPT-2's learned position table, `max_position_embeddings × hidden`.
    wpe: Option<Vec<f32>>,
    norm_weight: Vec<f32>,
    norm_bias: Option<Vec<f32>>,
    lm_head: Linear,
}

/// Rows of a pass whose logits a device computes with the pass (a decode pass's rows, drafts
/// included).
const DEVICE_LOGITS_ROWS: usize = 16;

/// The largest output of a layer's products kept from one pass to the next (a decode token's are
/// kilobytes; a 512-row prefill's gate/up megabytes).
const KEPT_OUTPUT_BYTES: usize = 64 << 10;

/// Layers `[a, b)` of one model, plus the embedding, final norm and lm_head on the head.
pub struct Stage {
    cfg: ModelConfig,
    precision: Precision,
    layers: Range<usize>,
    /// The layers, resident; empty when they stream from a shard.
    blocks: Vec<Block>,
    streamed: Option<Streamed>,
    /// The shard the resident layers are borrowed from, when they are.
    mapped: Option<Mapped>,
    head: Option<Head>,
    inv_freq: Vec<f32>,
    fingerprint: [u8; 32],
    backend: Arc<dyn Backend>,
    /// The device that runs the layers whole, when one was set.
    device: Option<Arc<dyn DeviceLayers>>,
    /// The logits the device computed with the last pass of a stage that ends the model: the bits
    /// of the rows they belong to, and the logits (see [`Stage::logits`]).
    device_logits: std::sync::Mutex<Option<(Vec<u32>, Vec<f32>)>>,
}

impl Stage {
    /// Load layers `layers` of the model in `src` (and the head's tensors when `head`).
    pub fn load(
        src: &dyn Source,
        cfg: &ModelConfig,
        layers: Range<usize>,
        head: bool,
        precision: Precision,
    ) -> Result<Self> {
        if layers.start > layers.end || layers.end > cfg.num_layers {
            return Err(Error::LayerRange {
                start: layers.start,
                end: layers.end,
                layers: cfg.num_layers,
            });
        }
        // Every int8 weight moves into one arena in huge pages as soon as it is made (decode streams
        // all of them on every token), so no more than one layer's worth is ever held twice.
        let mut arena = match precision.is_int8() {
            true => daisy_gemm_int8::WeightArena::new(),
            false => None,
        };
        let mut settle = |linear: &mut Linear| -> Result<()> {
            let Some(arena) = arena.as_mut() else {
                return Ok(());
            };
            for w in linear.planes_mut() {
                arena
                    .take(w)
                    .map_err(|e| crate::gemm::gemm_err(&|| "moving a weight".into(), e))?;
            }
            Ok(())
        };
        // The head first: its transient f32 copy of a tied embedding is gone before layers arrive.
        let head = if head {
            let mut head = load_head(src, cfg, precision)?;
            settle(&mut head.lm_head)?;
            Some(head)
        } else {
            None
        };
        let blocks = layers
            .clone()
            .map(|i| Block::load(src, cfg, i, precision, &mut settle))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg: cfg.clone(),
            precision,
            layers,
            blocks,
            streamed: None,
            mapped: None,
            head,
            inv_freq: rope_inv_freq(cfg.rope_theta, cfg.head_dim),
            fingerprint: src.fingerprint(),
            backend: Arc::new(CpuBackend::new()),
            device: None,
            device_logits: std::sync::Mutex::new(None),
        })
    }

    /// [`Stage::load`], with the layers streamed from the flat shard at `shard` (module `shard`):
    /// at most two of them unpacked at once. A shard already there for these layers of this model
    /// at this precision is used as it is (no layer is fetched or quantized again); otherwise each
    /// layer is loaded, written to it and dropped, so no more than one is ever held while loading.
    /// Returns the stage and whether the shard was there already.
    pub fn load_streamed(
        src: &dyn Source,
        cfg: &ModelConfig,
        layers: Range<usize>,
        head: bool,
        precision: Precision,
        shard: &Path,
    ) -> Result<(Self, bool)> {
        let mut stage = Self::load(src, cfg, layers.start..layers.start, head, precision)?;
        stage.layers = layers.clone();
        let key = ShardKey {
            fingerprint: src.fingerprint(),
            precision,
            layers: layers.clone(),
        };
        let found = Shard::open(shard, &key);
        let reused = found.is_ok();
        let opened = match found {
            Ok(s) => s,
            Err(_) => {
                let mut writer = ShardWriter::create(shard, key.clone())?;
                for i in layers {
                    writer.push(&Block::load(src, cfg, i, precision, &mut |_| Ok(()))?)?;
                }
                writer.finish()?;
                Shard::open(shard, &key)?
            }
        };
        stage.streamed = Some(Streamed::new(opened));
        Ok((stage, reused))
    }

    /// [`Stage::load`], with the layers resident but borrowed in place from the shard at `shard`,
    /// read whole into huge pages (memory-mapped where such memory cannot be had): nothing of them
    /// is fetched, widened or quantized, so the stage is ready in about the time the file takes
    /// to read and hash. Every layer's SHA-256 is computed here, on all of rayon's threads, and a
    /// layer that failed is refused by name the first time a forward runs it, and the file
    /// removed, so the next start writes it again. (Hashed on first use instead, a 1.1 B model's
    /// member spent a quarter of its first prefill on it: 0.2 s against 0.1 here, on two threads,
    /// where nothing else runs yet.) `None` when there is no shard of these layers of this model
    /// at this precision (or it is of another version, or not whole).
    pub fn load_mapped(
        src: &dyn Source,
        cfg: &ModelConfig,
        layers: Range<usize>,
        head: bool,
        precision: Precision,
        shard: &Path,
    ) -> Result<Option<Self>> {
        let key = ShardKey {
            fingerprint: src.fingerprint(),
            precision,
            layers: layers.clone(),
        };
        let Ok(opened) = Shard::open(shard, &key) else {
            return Ok(None);
        };
        let mut stage = Self::load(src, cfg, layers.start..layers.start, head, precision)?;
        stage.layers = layers.clone();
        let map = opened.map()?;
        stage.blocks = (0..layers.len())
            .map(|i| opened.block(cfg, precision, i, &map, None, false))
            .collect::<Result<Vec<_>>>()?;
        let checked = {
            use rayon::prelude::*;
            (0..layers.len())
                .into_par_iter()
                .map(|i| {
                    opened
                        .check(i, &map, opened.range(i))
                        .map_err(|e| e.to_string())
                })
                .collect()
        };
        // The layers' arrays hold the bytes they borrow (`map`) alive.
        stage.mapped = Some(Mapped {
            checked,
            shard: opened,
        });
        Ok(Some(stage))
    }

    /// Write the resident layers to a shard at `shard`, for [`Stage::load_mapped`] on the next
    /// start (a temporary file renamed into place, so a reader never sees part of it).
    pub fn write_shard(&self, shard: &Path) -> Result<()> {
        let key = ShardKey {
            fingerprint: self.fingerprint,
            precision: self.precision,
            layers: self.layers.clone(),
        };
        if self.blocks.len() != self.layers.len() {
            return Err(Error::Invalid(format!(
                "layers {:?} stream from a shard already",
                self.layers
            )));
        }
        let mut writer = ShardWriter::create(shard, key)?;
        for block in &self.blocks {
            writer.push(block)?;
        }
        writer.finish()
    }

    /// Whether the resident layers are borrowed from a mapped shard.
    pub fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    /// Whether the head's embedding table is mapped from the checkpoint's file (only the rows of
    /// tokens looked up are resident) rather than held; `false` off the head.
    pub fn is_embedding_mapped(&self) -> bool {
        self.head.as_ref().is_some_and(|h| h.embed.is_mapped())
    }

    /// Whether the layers stream from a shard.
    pub fn is_streamed(&self) -> bool {
        self.streamed.is_some()
    }

    /// Run this stage's int8 products on `backend` (the CPU backend by default). The caller admits
    /// the backend through `daisy_gemm_int8::exact_gates` first.
    pub fn set_backend(&mut self, backend: Arc<dyn Backend>) {
        self.backend = backend;
    }

    /// Hands every resident int8 weight to the backend to keep (a GPU copies them to its memory
    /// now, so the first pass does not); layers that stream from a shard come and go instead.
    pub fn keep_resident(&self) -> Result<()> {
        let head = self.head.as_ref().map(|h| &h.lm_head);
        let linears = self.blocks.iter().flat_map(|b| b.linears()).chain(head);
        for linear in linears {
            for w in linear.planes() {
                self.backend
                    .keep_resident(w)
                    .map_err(|e| crate::gemm::gemm_err(&|| "keeping weights resident".into(), e))?;
            }
        }
        Ok(())
    }

    /// Run the layers on `device` whole (residual stream and KV cache in its memory). Only a
    /// Llama-family stage at int8 whose layers are resident can; anything else is refused by name
    /// and keeps its per-product path.
    pub fn set_device(&mut self, device: Arc<dyn DeviceLayers>) -> Result<()> {
        if self.streamed.is_some() {
            return Err(Error::Invalid(format!(
                "{} runs resident layers; these stream from a shard",
                device.name()
            )));
        }
        if self.precision != Precision::Int8 || self.cfg.arch != Arch::Llama {
            return Err(Error::Invalid(format!(
                "{} runs Llama-family layers at int8; this stage is {:?} at {}",
                device.name(),
                self.cfg.arch,
                self.precision.name()
            )));
        }
        self.device = Some(device);
        Ok(())
    }

    /// The device that runs the layers whole, if one was set.
    pub fn device(&self) -> Option<&dyn DeviceLayers> {
        self.device.as_deref()
    }

    /// The backend int8 products run on.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            precision: self.precision,
            backend: &*self.backend,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The layers this stage runs.
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    pub fn is_head(&self) -> bool {
        self.head.is_some()
    }

    /// The fingerprint of the model the stage was loaded from.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    /// Bytes of weights held (embedding in its source dtype).
    pub fn weight_bytes(&self) -> usize {
        let head = self.head.as_ref().map_or(0, |h| {
            h.embed.bytes()
                + h.wpe.as_ref().map_or(0, |w| w.len() * 4)
                + (h.norm_weight.len() + h.norm_bias.as_ref().map_or(0, Vec::len)) * 4
                + h.lm_head.bytes()
        });
        head + self.blocks.iter().map(Block::bytes).sum::<usize>()
            + self.streamed.as_ref().map_or(0, |s| s.shard.bytes())
    }

    /// An empty KV cache for the cached path.
    pub fn new_cache(&self) -> StageCache {
        match &self.device {
            Some(d) => StageCache {
                layers: Vec::new(),
                device: Some(d.new_kv(self.layers.len())),
            },
            None => StageCache {
                layers: vec![LayerCache::default(); self.layers.len()],
                device: None,
            },
        }
    }

    /// The layers over the device: every layer's hash checked (mapped shards) and its tensors lent.
    fn forward_device(
        &self,
        device: &dyn DeviceLayers,
        x: &mut [f32],
        chunks: &[usize],
        pos0: usize,
        cache: Option<&mut StageCache>,
    ) -> Result<()> {
        let layers = self
            .blocks
            .iter()
            .enumerate()
            .map(|(i, b)| {
                self.check_mapped(i)?;
                b.llama(&self.cfg).ok_or_else(|| {
                    Error::Invalid(format!("layer {} is not a Llama layer at int8", b.index()))
                })
            })
            .collect::<Result<Vec<LlamaLayer<'_>>>>()?;
        let cfg = &self.cfg;
        let shape = LayerShape {
            hidden: cfg.hidden_size,
            heads: cfg.num_heads,
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            intermediate: cfg.intermediate_size,
            eps: cfg.norm_eps,
            attn_scale: crate::attention::score_scale(cfg.head_dim),
        };
        let kv = match cache {
            None => None,
            Some(c) => {
                if c.device.is_none() {
                    if c.layers.iter().any(|l| l.len() > 0) {
                        return Err(Error::Invalid(format!(
                            "a KV cache in host memory for a stage that runs on {}",
                            device.name()
                        )));
                    }
                    c.layers.clear();
                    c.device = Some(device.new_kv(self.blocks.len()));
                }
                c.device.as_mut().map(|d| &mut **d as &mut dyn DeviceKv)
            }
        };
        // A head that ends the model has the device run the final norm and the lm_head on the
        // pass's last rows too (as many as a decode pass scores), saving `logits` a round trip.
        let rows: usize = chunks.iter().sum();
        let head = match &self.head {
            Some(hd) if self.layers.end == cfg.num_layers && hd.norm_bias.is_none() => {
                match (hd.lm_head.int8(), hd.lm_head.bias()) {
                    (Some(w), None) => Some(DeviceHead {
                        norm: &hd.norm_weight,
                        lm_head: w,
                        rows: rows.min(DEVICE_LOGITS_ROWS),
                    }),
                    _ => None,
                }
            }
            _ => None,
        };
        let logits = device.forward(
            &shape,
            &layers,
            &self.inv_freq,
            x,
            chunks,
            pos0,
            kv,
            head.as_ref(),
        )?;
        let mut kept = self
            .device_logits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The device may give fewer rows than asked (those of its last submission): the logits'
        // own length says how many.
        *kept = match (logits, head) {
            (Some(l), Some(hd)) if hd.lm_head.n() > 0 && l.len() / hd.lm_head.n() <= rows => {
                let got = l.len() / hd.lm_head.n();
                Some((
                    x[(rows - got) * cfg.hidden_size..]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect(),
                    l,
                ))
            }
            _ => None,
        };
        Ok(())
    }

    /// The embedded rows of `ids` at positions `pos0..` (head only).
    pub fn embed(&self, ids: &[u32], pos0: usize) -> Result<Vec<f32>> {
        let head = self.head.as_ref().ok_or(Error::NotHead("embedding"))?;
        let h = self.cfg.hidden_size;
        if pos0 + ids.len() > self.cfg.max_position_embeddings {
            return Err(Error::TooLong {
                len: pos0 + ids.len(),
                max: self.cfg.max_position_embeddings,
            });
        }
        let vocab = head.embed.rows();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::TokenOutOfRange { id, vocab });
        }
        let mut x = Vec::with_capacity(ids.len() * h);
        head.embed.look_up(ids, &mut x)?;
        if let Some(wpe) = &head.wpe {
            for (r, row) in x.chunks_exact_mut(h).enumerate() {
                let p = &wpe[(pos0 + r) * h..(pos0 + r + 1) * h];
                for (v, pv) in row.iter_mut().zip(p) {
                    *v += pv;
                }
            }
        }
        if let Some(value) = first_non_finite(&x) {
            return Err(Error::NonFinite {
                place: "the embedding".to_string(),
                value,
            });
        }
        Ok(x)
    }

    /// Run this stage's layers over `rows` rows at positions `pos0..`, in place. With a cache (the
    /// cached path) the rows continue the cached keys; without, they are the whole window.
    pub fn forward(
        &self,
        x: &mut [f32],
        rows: usize,
        pos0: usize,
        cache: Option<&mut StageCache>,
    ) -> Result<()> {
        self.forward_passes(x, &[rows], pos0, cache)
    }

    /// [`Stage::forward`] on the cached path over consecutive passes of `chunks` rows (summing to
    /// the rows of `x`, from `pos0`): the same bits as one call per chunk. A stage whose layers
    /// run on a device sends them all in one submission; on the host they run one by one.
    pub fn forward_chunks(
        &self,
        x: &mut [f32],
        chunks: &[usize],
        pos0: usize,
        cache: &mut StageCache,
    ) -> Result<()> {
        self.forward_passes(x, chunks, pos0, Some(cache))
    }

    fn forward_passes(
        &self,
        x: &mut [f32],
        chunks: &[usize],
        pos0: usize,
        mut cache: Option<&mut StageCache>,
    ) -> Result<()> {
        let rows: usize = chunks.iter().sum();
        let h = self.cfg.hidden_size;
        if x.len() != rows * h {
            return Err(Error::Activation {
                got: x.len() / rows.max(1),
                pos: pos0,
                expected: h,
                want_pos: pos0,
            });
        }
        if pos0 + rows > self.cfg.max_position_embeddings {
            return Err(Error::TooLong {
                len: pos0 + rows,
                max: self.cfg.max_position_embeddings,
            });
        }
        if let Some(value) = first_non_finite(x) {
            return Err(Error::NonFinite {
                place: format!("the input of layer {}", self.layers.start),
                value,
            });
        }
        if let Some(device) = &self.device {
            return self.forward_device(&**device, x, chunks, pos0, cache);
        }
        if chunks.len() > 1 {
            let mut at = 0;
            for &c in chunks {
                let rows_x = &mut x[at * h..(at + c) * h];
                self.forward_passes(rows_x, &[c], pos0 + at, cache.as_deref_mut())?;
                at += c;
            }
            return Ok(());
        }
        if let Some(streamed) = &self.streamed {
            return self.forward_streamed(streamed, x, rows, pos0, cache);
        }
        let rope = Rope::new(&self.inv_freq, self.cfg.head_dim, pos0, rows);
        match cache {
            Some(cache) => {
                if cache.device.is_some() {
                    return Err(Error::Invalid(
                        "a KV cache in a device's memory for a stage that runs on the host".into(),
                    ));
                }
                if cache.layers.len() != self.blocks.len() {
                    return Err(Error::Invalid(format!(
                        "cache of {} layers for a stage of {}",
                        cache.layers.len(),
                        self.blocks.len()
                    )));
                }
                for (i, (b, c)) in self.blocks.iter().zip(cache.layers.iter_mut()).enumerate() {
                    self.check_mapped(i)?;
                    b.forward(&self.cfg, self.ctx(), &rope, x, rows, pos0, Some(c))?;
                }
            }
            None => {
                for (i, b) in self.blocks.iter().enumerate() {
                    self.check_mapped(i)?;
                    b.forward(&self.cfg, self.ctx(), &rope, x, rows, pos0, None)?;
                }
            }
        }
        // The layers' outputs went round from one layer to the next; the large ones (a long
        // prompt's) are not kept past the pass.
        daisy_gemm_int8::release_outputs_over(KEPT_OUTPUT_BYTES);
        Ok(())
    }

    /// Whether local layer `i`, when it is borrowed from a mapped shard, passed its hash; one that
    /// did not is refused and its file removed.
    fn check_mapped(&self, i: usize) -> Result<()> {
        let Some(m) = &self.mapped else {
            return Ok(());
        };
        if let Err(e) = &m.checked[i] {
            m.shard.remove();
            return Err(Error::Invalid(e.clone()));
        }
        Ok(())
    }

    /// [`Stage::forward`] over streamed layers: the current and the next live, the current dropped
    /// once run.
    fn forward_streamed(
        &self,
        streamed: &Streamed,
        x: &mut [f32],
        rows: usize,
        pos0: usize,
        mut cache: Option<&mut StageCache>,
    ) -> Result<()> {
        let n = self.layers.len();
        if let Some(c) = &cache
            && c.layers.len() != n
        {
            return Err(Error::Invalid(format!(
                "cache of {} layers for a stage of {n}",
                c.layers.len()
            )));
        }
        let unpack =
            |i: usize| move |check: bool| streamed.unpack(&self.cfg, self.precision, i, check);
        let rope = Rope::new(&self.inv_freq, self.cfg.head_dim, pos0, rows);
        for i in 0..n {
            let block = {
                let mut live = streamed.live();
                let block = live.make_live(i, unpack(i))?;
                if i + 1 < n {
                    live.make_live(i + 1, unpack(i + 1))?;
                }
                block
            };
            let layer_cache = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            let ran = block.forward(&self.cfg, self.ctx(), &rope, x, rows, pos0, layer_cache);
            streamed.live().drop_layer(i);
            ran?;
        }
        Ok(())
    }

    /// Final norm and lm_head over `rows` rows of the returned hidden state (head only).
    pub fn logits(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let head = self.head.as_ref().ok_or(Error::NotHead("the lm_head"))?;
        let h = self.cfg.hidden_size;
        if x.len() != rows * h {
            return Err(Error::Activation {
                got: x.len() / rows.max(1),
                pos: 0,
                expected: h,
                want_pos: 0,
            });
        }
        // The device's logits of these very rows, when its last pass computed them.
        let kept = self
            .device_logits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((bits, logits)) = kept.as_ref()
            && !x.is_empty()
            && let Some(skip) = bits.len().checked_sub(x.len())
            && bits[skip..].iter().zip(x).all(|(b, v)| *b == v.to_bits())
        {
            let v = logits.len() / (bits.len() / h);
            let logits = logits[skip / h * v..].to_vec();
            drop(kept);
            if let Some(value) = first_non_finite(&logits) {
                return Err(Error::NonFinite {
                    place: "the lm_head".to_string(),
                    value,
                });
            }
            return Ok(logits);
        }
        drop(kept);
        let mut hs = x.to_vec();
        match &head.norm_bias {
            Some(b) => layer_norm(&mut hs, h, &head.norm_weight, b, self.cfg.norm_eps),
            None => rms_norm(&mut hs, h, &head.norm_weight, self.cfg.norm_eps),
        }
        let logits = head
            .lm_head
            .forward(self.ctx(), &hs, rows, &|| "the lm_head".to_string())?;
        if let Some(value) = first_non_finite(&logits) {
            return Err(Error::NonFinite {
                place: "the lm_head".to_string(),
                value,
            });
        }
        Ok(logits)
    }
}

/// A mapped shard that resident layers borrow from, and each layer's hash check as the stage
/// loaded (its refusal, where it failed).
struct Mapped {
    shard: Shard,
    checked: Vec<std::result::Result<(), String>>,
}

fn load_head(src: &dyn Source, cfg: &ModelConfig, precision: Precision) -> Result<Head> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let (embed_name, norm, lm_name) = match cfg.arch {
        Arch::Llama => ("model.embed_tokens.weight", "model.norm", "lm_head.weight"),
        Arch::Gpt2 => ("wte.weight", "ln_f", "lm_head.weight"),
    };
    let embed = Embedding::load(src, embed_name, v, h)?;
    let wpe = match cfg.arch {
        Arch::Gpt2 => Some(read_shaped(
            src,
            "wpe.weight",
            &[cfg.max_position_embeddings, h],
        )?),
        Arch::Llama => None,
    };
    let norm_weight = read_shaped(src, &format!("{norm}.weight"), &[h])?;
    let norm_bias = match cfg.arch {
        Arch::Gpt2 => Some(read_shaped(src, &format!("{norm}.bias"), &[h])?),
        Arch::Llama => None,
    };
    let lm_head = if cfg.tie_word_embeddings {
        Linear::tied(precision, &embed, v, h)?
    } else {
        Linear::stacked(precision, src, &[(lm_name.to_string(), v)], h, None)?
    };
    Ok(Head {
        embed,
        wpe,
        norm_weight,
        norm_bias,
        lm_head,
    })
}
