//! A device that runs a stage's Llama-family layers whole: the residual stream, every operand
//! between the products and the KV cache stay in the device's memory, and only the last hidden
//! state comes back. It must give the CPU's bits (DESIGN.md §3.8): the same int8 products, and every
//! float step between them the CPU's to the bit; the model crate says what to compute, the device
//! crate (`daisy-wgsl`) how.

use daisy_gemm_int8::PackedWeights;

use crate::Result;

/// One Llama-family layer held at int8, borrowed for a pass.
pub struct LlamaLayer<'a> {
    /// The layer's index in the model (for errors).
    pub index: usize,
    pub input_norm: &'a [f32],
    /// Q, K and V stacked (`(heads + 2·kv_heads)·head_dim × hidden`).
    pub qkv: &'a PackedWeights,
    pub qkv_bias: Option<&'a [f32]>,
    pub o: &'a PackedWeights,
    pub post_norm: &'a [f32],
    /// Gate and up stacked (`2·intermediate × hidden`).
    pub gate_up: &'a PackedWeights,
    pub down: &'a PackedWeights,
    /// The sliding window of the layer's attention, if it has one.
    pub window: Option<usize>,
}

/// The shapes every layer of a model shares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerShape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub eps: f32,
    /// Attention's score scale, `head_dim^-0.5` as the CPU forms it.
    pub attn_scale: f32,
}

/// The head's last steps after a stage that ends the model, run by the device in the same pass:
/// the final RMSNorm and the lm_head (int8, no bias) over the pass's last `rows` rows, giving the
/// logits [`crate::Stage::logits`] would (the same bits).
pub struct DeviceHead<'a> {
    pub norm: &'a [f32],
    pub lm_head: &'a PackedWeights,
    pub rows: usize,
}

/// Runs Llama-family layers on a device with the CPU's bits.
pub trait DeviceLayers: Send + Sync {
    /// The device, for logs and errors.
    fn name(&self) -> String;

    /// Runs `layers` over the rows of `x` (`rows × hidden`) at positions `pos0..`, in place, as
    /// the passes of `chunks` (their rows, in order, summing to `rows`) one after the other: each
    /// attends to the keys before it and its own, exactly as separate passes would (every step
    /// but attention is row by row). With `kv` the rows continue the keys it holds (the cached
    /// path); without it they are the whole window (one chunk). `inv_freq` is RoPE's. With `head`
    /// it returns the logits of the last `head.rows` rows too (`rows × vocab`).
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<Option<Vec<f32>>>;

    /// An empty KV cache for `layers` layers, in the device's memory.
    fn new_kv(&self, layers: usize) -> Box<dyn DeviceKv>;
}

/// A KV cache a [`DeviceLayers`] keeps in its own memory.
pub trait DeviceKv: Send + std::fmt::Debug {
    /// Positions held.
    fn len(&self) -> usize;

    /// Whether no position is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keep the first `len` positions (each position's keys and values are its own).
    fn truncate(&mut self, len: usize);

    /// The device's own type, for the device that made it.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}
